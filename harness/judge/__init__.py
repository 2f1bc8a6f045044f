"""The judge: comparison functions and verdicts. Pure numpy: no torch, no Ray, no files.
Runners produce outputs, the judge says what they mean, the store keeps both."""
