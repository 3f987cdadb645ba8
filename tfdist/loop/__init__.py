"""What a training loop does between steps: the driver of the hooks' Python side and
`tfdist.function` for your own loop (`driver`)."""
