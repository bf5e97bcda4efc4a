"""Build a CVM model exercising the transform ops, with seeded random int8 tables; write it with its sample.

    python models/transforms/make.py [OUT_DIR]        (default: this script's directory)

data (1, 6): token ids (the sample has ids outside 0..31, which both lookups clip into range).

    emb   = take(embedding (32, 4), data, axis=0)                      (1, 6, 4)
    et    = transpose(emb, axes=(0, 2, 1))                             (1, 4, 6)
    rev   = strided_slice(et, begin=(0, 3, 5), end=(1, -5, -7), stride=(1, -1, -2))
                                                                       (1, 4, 3): features and tokens 5, 3, 1 reversed
    lut   = expand_dims(cvm_lut(data, table (32,), in_dim=32), axis=1) (1, 1, 6)
    lrev  = tile(strided_slice(lut, begin=(0, 0, 5), end=(1, 1, -7), stride=(1, 1, -2)), reps=(1, 4, 1))
                                                                       (1, 4, 3)
    sel   = where(broadcast_greater(rev, lrev), rev, lrev)             (1, 4, 3): full-shape condition
    rep   = repeat(sel, repeats=2, axis=2)                             (1, 4, 6)
    cat   = concatenate(rep, et, axis=1)                               (1, 8, 6)
    out   = squeeze(expand_dims(slice_like(reshape(cat, shape=(2, 4, -1)), sel, axis=(1, 2)), axis=0),
                    axis=(0,))                                          (2, 4, 3)

Writes symbol, params, input.npy and expected.npy (the reference executor's output for the sample).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model

SEED = 2
VOCAB, FEATURES, TOKENS = 32, 4, 6


def build(rng: np.random.Generator):
    b = GraphBuilder()
    data = b.input("data", (1, TOKENS), 8)
    embedding = b.param("embedding", rng.integers(-127, 128, (VOCAB, FEATURES)).astype(np.int8), 8)
    table = b.param("table", rng.integers(-127, 128, VOCAB).astype(np.int8), 8)

    emb = b.op("take", embedding, data, name="embed", axis=0)
    et = b.op("transpose", emb, name="features_first", axes=(0, 2, 1))
    rev = b.op("strided_slice", et, name="reverse", begin=(0, 3, 5), end=(1, -5, -7), stride=(1, -1, -2))
    lut = b.op("cvm_lut", data, table, name="lut", in_dim=VOCAB)
    lut = b.op("expand_dims", lut, name="lut_row", axis=1)
    lrev = b.op("strided_slice", lut, name="lut_reverse", begin=(0, 0, 5), end=(1, 1, -7), stride=(1, 1, -2))
    lrev = b.op("tile", lrev, name="lut_tile", reps=(1, FEATURES, 1))
    cond = b.op("broadcast_greater", rev, lrev, name="greater")
    sel = b.op("where", cond, rev, lrev, name="select")
    rep = b.op("repeat", sel, name="repeat", repeats=2, axis=2)
    cat = b.op("concatenate", rep, et, name="join", axis=1)
    r = b.op("reshape", cat, name="split", shape=(2, FEATURES, -1))
    out = b.op("slice_like", r, sel, name="crop", axis=(1, 2))
    out = b.op("expand_dims", out, name="batch", axis=0)
    return b.build(b.op("squeeze", out, name="unbatch", axis=(0,)))


def main(out: Path) -> None:
    rng = np.random.default_rng(SEED)
    graph = build(rng)
    x = np.array([[3, -5, 17, 40, 31, 0]], np.int8)  # -5 and 40 lie outside the table: clipped to 0 and 31
    [y] = execute(graph, x)
    out.mkdir(parents=True, exist_ok=True)
    write_model(graph, out)
    np.save(out / "input.npy", x)
    np.save(out / "expected.npy", y)
    print(y)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
