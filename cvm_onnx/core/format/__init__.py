"""The CVM model files: the symbol JSON and the params binary, read and written as the runtime does."""
from .edges import Edge, Edges, Slot, read_edges
from .model_dir import read_model, write_model
from .params import read_params, write_params
from .symbol import pack_symbol, read_symbol, unpack_symbol, write_symbol

__all__ = ["Edge", "Edges", "Slot", "pack_symbol", "read_edges", "read_model", "read_params", "read_symbol",
           "unpack_symbol", "write_model", "write_params", "write_symbol"]
