"""Development doubles: the embedded stack, fakes of the systems we do not own, the multi-host rig, the demo."""
