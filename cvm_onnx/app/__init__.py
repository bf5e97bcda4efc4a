"""What users call: the convert pipeline, the Python front door (api), quantize, reports, Netron, the CLI."""
