"""The session process: the thin `tandem agent session` proxy inside an inference pod."""
