"""What each task runs: the user's command, or tfdist's own TF server process.

Under ParameterServerStrategy only the coordinator (the chief) runs the training script;
workers and parameter servers just host a `tf.distribute.Server` that the coordinator
drives. Every other strategy runs the script in every task. The capability table
(`Capabilities.server_tasks`) says which.
"""

from tfdist.capabilities import capabilities

SERVER_MODULE = "tfdist.launch.server"


def runs_server(strategy_name, job):
    """True when task type `job` hosts a TF server instead of running the user's command."""
    return job in capabilities(strategy_name).server_tasks


def task_argv(strategy_name, job, command, python="python"):
    """The argv a task of type `job` runs: `command`, or the TF server module."""
    return [python, "-m", SERVER_MODULE] if runs_server(strategy_name, job) else list(command)
