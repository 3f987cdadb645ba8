"""The local multi-process launcher behind `tfdist launch`."""

from tfdist.launch.launcher import LaunchError, Launcher, launch

__all__ = ["LaunchError", "Launcher", "launch"]
