"""Running exported models: onnxruntime sessions (sessions), the exact comparison with the reference executor
(verify), many inputs in one process (bulk) or on Ray actors (on_ray), Triton model repositories (triton)."""
