"""What a training loop does around and between steps: the per-step rules written once
(`runner`: every loop — `model.fit`'s callback, `tfdist.Trainer`, `tfdist.function` —
calls one `StepRunner`), the driver of the hooks' Python side (`driver`) and
`tfdist.function` for your own loop (`function`)."""
