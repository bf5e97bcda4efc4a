"""The CVM model: its files (format/), its 37 ops (ops/), load-time validation, the reference executor and
batching. Knows nothing of ONNX sessions, converters or the command line."""
