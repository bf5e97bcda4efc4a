"""The route cache (``serving.route_cache``): a layout measured once per CPU, model, threads, operands and build,
remembered in a file, taken again without measuring; a damaged or unwritable file ignored with a warning. Timed
with a fake clock: each candidate's run advances it by that candidate's cost, so no test depends on real time."""
from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import session
from cvm_onnx.serving import route_cache
from cvm_onnx.serving.route_cache import (FILE, MEASUREMENT, REPEAT, ROUNDS, WARMUP, Choice, RouteKey, choose, lookup,
                                          measure, model_digest)
from cvm_onnx.serving.routes import remembered, route_lines
from cvm_onnx.serving.target import Target

LAYOUTS = ("rows", "fused", "columns")
KEY = RouteKey("Some CPU [avx2]", "0" * 32, 1, "u8u8", "cvm-onnx 0, onnxruntime 0, library none")


class Clock:
    """A fake clock: ``runs(costs)`` gives one run per layout, each advancing it by its cost (whole seconds, one per
    call in turn, the last repeated: every difference exact), and counts the calls. ``switched[k] = (n, cost)``: the
    first n calls of k after another layout's call (or none) cost ``cost`` instead (another session's threads still
    spinning, its data in the caches)."""

    def __init__(self) -> None:
        self.now, self.calls, self.last, self.streak = 0, {}, None, 0

    def __call__(self) -> float:
        return self.now

    def runs(self, costs: dict[str, list[int]], switched: dict[str, tuple[int, int]] | None = None) -> dict:
        def run(k: str) -> None:
            n = self.calls.get(k, 0)
            self.calls[k] = n + 1
            self.streak = self.streak + 1 if k == self.last else 0
            self.last = k
            after, slow = (switched or {}).get(k, (0, 0))
            self.now += slow if self.streak < after else costs[k][min(n, len(costs[k]) - 1)]
        return {k: (lambda k=k: run(k)) for k in costs}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CVM_ONNX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CVM_ONNX_NO_CACHE", raising=False)
    return tmp_path / "cache"


def never() -> dict:
    raise AssertionError("measured although the choice was remembered")


def test_a_miss_measures_and_remembers_and_a_hit_takes_it_without_running(cache):
    clock = Clock()
    first = choose(KEY, lambda: clock.runs({"rows": [2], "fused": [1], "columns": [3]}), LAYOUTS, clock=clock)
    assert (first.layout, first.source) == ("fused", "measured")
    assert first.times == {"rows": 2000.0, "fused": 1000.0, "columns": 3000.0}
    assert clock.calls == {k: 3 + 4 * (1 + 5) for k in LAYOUTS}  # 3 warm-ups, then 4 rounds of 1 untimed + 5 timed
    entry = json.loads((cache / FILE).read_text())["routes"][KEY.text()]
    assert (entry["layout"], entry["cpu"], entry["threads"]) == ("fused", KEY.cpu, 1)
    again = choose(KEY, never, LAYOUTS, clock=clock)
    assert again == Choice("fused", first.times, "cache") and lookup(KEY) == again
    assert "from the route cache" in again.note() and "measured at session creation" in first.note()


def test_fresh_measures_again_and_replaces_the_remembered_choice(cache):
    clock = Clock()
    choose(KEY, lambda: clock.runs({"rows": [2], "fused": [1]}), ("rows", "fused"), clock=clock)
    now = choose(KEY, lambda: clock.runs({"rows": [1], "fused": [2]}), ("rows", "fused"), fresh=True,
                 clock=clock)
    assert now.layout == "rows" and lookup(KEY).layout == "rows"
    assert len(json.loads((cache / FILE).read_text())["routes"]) == 1


@settings(deadline=None)
@given(costs=st.dictionaries(st.sampled_from(LAYOUTS), st.lists(st.integers(1, 10 ** 6), min_size=1, max_size=40),
                             min_size=1))
def test_the_measurement_keeps_each_candidates_best_round_and_the_fastest(costs):
    """A candidate's time is the lowest over rounds of the median of its timed calls in that round (a slow stretch
    does not count against it; its warm-up calls and each round's first call are not timed), the layout the first
    of the lowest: the oracle recomputes it from the costs."""
    clock = Clock()
    got = measure(clock.runs(costs), clock)
    want = {}
    for k, v in costs.items():
        calls = [v[min(n, len(v) - 1)] for n in range(WARMUP + ROUNDS * (1 + REPEAT))]
        rounds = [calls[WARMUP + r * (1 + REPEAT) + 1:WARMUP + (r + 1) * (1 + REPEAT)] for r in range(ROUNDS)]
        want[k] = min(1e3 * sorted(timed)[REPEAT // 2] for timed in rounds)
    assert got.times == want
    assert got.layout == min(costs, key=lambda k: (want[k], list(costs).index(k)))


def test_a_layout_slow_only_on_its_first_runs_and_after_another_layouts_still_wins():
    """The fused layout is the fastest in its steady state (9 against rows' 11 and columns' 18) but slow (14) on a
    session's first 3 runs and on its first 2 runs after another layout's session ran (what the measurement of
    version 1 timed, keeping rows): the steady state wins."""
    clock = Clock()
    got = measure(clock.runs({"rows": [11], "fused": [14, 14, 14, 9], "columns": [18]}, {"fused": (2, 14)}), clock)
    assert got.layout == "fused" and got.times == {"rows": 11000.0, "fused": 9000.0, "columns": 18000.0}


def test_a_choice_an_earlier_measurement_made_is_measured_anew(cache):
    """An entry stored under the key of measurement version 1 (no version in the key) is not taken: the layouts are
    measured again and the new choice stored beside it."""
    assert MEASUREMENT > 1 and KEY.measurement == MEASUREMENT
    old = {k: v for k, v in asdict(KEY).items() if k != "measurement"}
    old_text = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()
    assert old_text != KEY.text()
    cache.mkdir()
    (cache / FILE).write_text(json.dumps({"format": 1, "routes": {old_text: {"layout": "rows", "ms": {
        "rows": 11.5, "fused": 14.0}}}}))
    clock = Clock()
    got = choose(KEY, lambda: clock.runs({"rows": [11], "fused": [9]}), ("rows", "fused"), clock=clock)
    assert (got.layout, got.source) == ("fused", "measured")
    routes = json.loads((cache / FILE).read_text())["routes"]
    assert routes[KEY.text()]["measurement"] == MEASUREMENT and routes[old_text]["layout"] == "rows"


def test_a_different_cpu_is_a_miss_and_both_are_kept(cache, monkeypatch):
    clock = Clock()
    choose(KEY, lambda: clock.runs({"rows": [1], "fused": [2]}), ("rows", "fused"), clock=clock)
    other = replace(KEY, cpu="Another CPU [avx2 avx512bw avx512_vnni]")
    assert lookup(other) is None
    assert choose(other, lambda: clock.runs({"rows": [2], "fused": [1]}), ("rows", "fused"),
                  clock=clock).layout == "fused"
    assert lookup(KEY).layout == "rows" and lookup(other).layout == "fused"
    model = to_onnx(_conv_graph(), Target())
    here = RouteKey.of(model, 1, "u8u8")
    monkeypatch.setattr(route_cache.cpu, "features", lambda: ("a feature no CPU has",))
    assert RouteKey.of(model, 1, "u8u8").cpu != here.cpu
    assert RouteKey.of(model, 2, "u8u8") != RouteKey.of(model, 1, "u8u8")  # the threads are part of the key


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"format": 99, "routes": {}}', "\udcff"])
def test_a_damaged_file_is_ignored_with_a_warning_and_rewritten(cache, text):
    cache.mkdir()
    (cache / FILE).write_bytes(text.encode("utf-8", "surrogateescape"))
    clock = Clock()
    with pytest.warns(RuntimeWarning, match="damaged|cannot be read"):
        got = choose(KEY, lambda: clock.runs({"rows": [1], "fused": [2]}), ("rows", "fused"), clock=clock)
    assert got.source == "measured" and lookup(KEY).layout == "rows"


def test_a_damaged_entry_is_a_miss(cache):
    cache.mkdir()
    (cache / FILE).write_text(json.dumps({"format": 1, "routes": {KEY.text(): {"layout": "rows", "ms": {"fused": 1}}}}))
    assert lookup(KEY) is None


def test_an_unwritable_cache_warns_and_the_session_still_gets_its_choice(tmp_path, monkeypatch):
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("CVM_ONNX_CACHE_DIR", str(tmp_path / "a file"))
    clock = Clock()
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        got = choose(KEY, lambda: clock.runs({"rows": [2], "fused": [1]}), ("rows", "fused"), clock=clock)
    assert got.layout == "fused"


def test_no_cache_measures_every_time_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CVM_ONNX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CVM_ONNX_NO_CACHE", "1")
    clock = Clock()
    for _ in range(2):
        assert choose(KEY, lambda: clock.runs({"rows": [1]}), ("rows",), clock=clock).source == "measured"
    assert not (tmp_path / "cache").exists()


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("CVM_ONNX_NO_CACHE", raising=False)
    monkeypatch.delenv("CVM_ONNX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert route_cache.cache_dir() == tmp_path / "xdg" / "cvm-onnx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert route_cache.cache_dir() == tmp_path / "home" / ".cache" / "cvm-onnx"
    monkeypatch.setenv("CVM_ONNX_NO_CACHE", "0")
    assert route_cache.cache_dir() is not None


def test_the_file_keeps_the_entries_stored_last(cache, monkeypatch):
    monkeypatch.setattr(route_cache, "MAX_ENTRIES", 3)
    clock = Clock()
    keys = [replace(KEY, threads=t) for t in range(1, 6)]
    for k in keys:
        choose(k, lambda: clock.runs({"rows": [1]}), ("rows",), clock=clock)
    assert [lookup(k) is not None for k in keys] == [False, False, True, True, True]


def _conv_graph(channels: int = 16, size: int = 16, weights_seed: int = 0):
    from cvm_onnx.core.builder import GraphBuilder

    rng = np.random.default_rng(weights_seed)
    b = GraphBuilder()
    x = b.input("data", (1, 3, size, size), 8)
    y = b.op("conv2d", x, b.param("w", rng.integers(-127, 128, (channels, 3, 3, 3)), 8), channels=channels,
             kernel_size=(3, 3), padding=(1, 1), use_bias=False)
    y = b.op("relu", b.op("cvm_right_shift", y, shift_bit=6, precision=8))
    y = b.op("conv2d", y, b.param("w2", rng.integers(-127, 128, (channels, channels, 3, 3)), 8), channels=channels,
             kernel_size=(3, 3), padding=(1, 1), use_bias=False)
    return b.build(b.op("cvm_right_shift", y, shift_bit=8, precision=8))


def test_the_model_digest_reads_shapes_and_layout_not_weight_values():
    a = to_onnx(_conv_graph(weights_seed=0), Target())
    assert model_digest(a) == model_digest(to_onnx(_conv_graph(weights_seed=1), Target()))
    assert model_digest(a) != model_digest(to_onnx(_conv_graph(size=12), Target()))
    assert model_digest(a) != model_digest(to_onnx(_conv_graph(channels=8), Target()))
    assert model_digest(a) != model_digest(to_onnx(_conv_graph(), Target(), batch=4))


def test_a_session_measures_once_remembers_and_info_says_where_the_layout_came_from(cache):
    """The first session of a layout-"session" model measures the layouts and writes the cache; the second takes
    the remembered layout (its cvm.routes says so); both equal the reference executor; ``cvm-onnx info``'s route map
    names the layout's source."""
    graph = _conv_graph()
    model = to_onnx(graph, Target())
    data = np.random.default_rng(1).integers(-127, 128, (1, 3, 16, 16)).astype(np.int32)
    want = execute(graph, {"data": data})[0]
    if not Target.native().cpu_integer:
        pytest.skip("no native library: no integer-products layouts to choose from")
    assert any("not measured here yet" in line for line in route_lines(model))
    notes = []
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sess = session(model)
        assert np.array_equal(sess.run(None, {"data": data})[0], want)
        routes = json.loads(sess.get_modelmeta().custom_metadata_map["cvm.routes"])
        notes.append({r[1].split("; ", 1)[1] for r in routes if r[1].startswith("integer products")})
    (measured,), (cached,) = notes
    assert measured.startswith("layout measured at session creation: rows ") and "from the route cache" in cached
    known = remembered(model)
    assert known is not None and known.layout in LAYOUTS and cached.endswith(f"{known.layout} taken")
    assert any(line.strip().startswith(f"layout {known.layout}, from the route cache") for line in route_lines(model))


@pytest.mark.parametrize("remembered_layout", ["rows", "columns"])
def test_convert_target_native_fixes_the_layout_a_session_here_takes(cache, tmp_path, remembered_layout):
    """``convert --target native`` fixes the layout remembered for the model here (else measured), not the ISA's
    guess: a remembered choice of ``remembered_layout`` is what the file states and runs, exactly."""
    from cvm_onnx.app.cli import main
    from cvm_onnx.core.format import write_model

    if not Target.native().cpu_integer:
        pytest.skip("no native library: no integer-products layouts to choose from")
    graph = _conv_graph()
    write_model(graph, tmp_path / "model")
    key = RouteKey.of(to_onnx(graph, Target()), 1, Target.native().operands)
    route_cache.remember(key, Choice(remembered_layout, {k: 1.0 + (k != remembered_layout) for k in LAYOUTS},
                                     "measured"))
    assert main(["convert", str(tmp_path / "model"), "-o", str(tmp_path / "n.onnx"), "--target", "native"]) == 0
    import onnx

    model = onnx.load(str(tmp_path / "n.onnx"))
    assert Target.of(model).layout == remembered_layout
    data = np.random.default_rng(2).integers(-127, 128, (1, 3, 16, 16)).astype(np.int32)
    assert np.array_equal(session(model).run(None, {"data": data})[0], execute(graph, {"data": data})[0])


def test_layout_choice_is_the_sessions_choice_and_none_without_one(cache):
    from cvm_onnx.runtime.sessions import layout_choice

    if not Target.native().cpu_integer:
        pytest.skip("no native library: no integer-products layouts to choose from")
    model = to_onnx(_conv_graph(), Target())
    first = layout_choice(model)
    assert first.source == "measured" and set(first.times) == set(LAYOUTS)
    assert layout_choice(model) == replace(first, source="cache") == remembered(model)
    assert layout_choice(model, fresh=True).source == "measured"
    assert layout_choice(to_onnx(_conv_graph(), Target(layout="rows"))) is None  # fixed at export
    assert layout_choice(to_onnx(_conv_graph(), Target(products="float"))) is None  # no integer products


def test_a_layout_onnxruntime_refuses_is_measured_without_and_named(cache, monkeypatch):
    """Where onnxruntime refuses one candidate (here a columns form made unloadable), the session warns naming it,
    measures the others, and remembers a choice among them; the next session takes it without a warning."""
    import onnx

    from cvm_onnx.runtime import sessions

    if not Target.native().cpu_integer:
        pytest.skip("no native library: no integer-products layouts to choose from")
    forms = sessions._serving_forms

    def broken_columns(*args):
        candidates, operands = forms(*args)
        if "columns" in candidates:
            bad = onnx.ModelProto()
            bad.CopyFrom(candidates["columns"])
            bad.graph.node.append(onnx.helper.make_node("no_such_kernel", [bad.graph.input[0].name], ["unread"],
                                                        domain="cvm.native"))
            candidates["columns"] = bad
        return candidates, operands

    monkeypatch.setattr(sessions, "_serving_forms", broken_columns)
    graph = _conv_graph()
    model = to_onnx(graph, Target())
    data = np.random.default_rng(3).integers(-127, 128, (1, 3, 16, 16)).astype(np.int32)
    with pytest.warns(RuntimeWarning, match="layout columns: onnxruntime refused it"):
        sess = session(model)
    assert np.array_equal(sess.run(None, {"data": data})[0], execute(graph, {"data": data})[0])
    assert set(remembered(model).times) == {"rows", "fused"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session(model)


def test_the_candidates_are_timed_with_spinning_stopped_between_runs_and_the_session_spins_as_configured(cache,
                                                                                                          monkeypatch):
    """Each candidate's session has its own thread pool: the timed ones stop spinning when a run ends (an idle
    candidate's threads would spin on the CPUs the next one is timed on), with the threads and spinning of the
    session asked for; the session returned keeps spinning between runs, and is exact."""
    import onnxruntime as ort

    from cvm_onnx.runtime import sessions

    if not Target.native().cpu_integer:
        pytest.skip("no native library: no integer-products layouts to choose from")
    sessions.check_onnxruntime()  # its probe session, made once per process, before the sessions recorded
    made = []

    def config(so, key):
        try:
            return so.get_session_config_entry(key)
        except RuntimeError:  # not set
            return None

    class Recorded(ort.InferenceSession):
        def __init__(self, model, so, **kwargs):
            made.append((so.intra_op_num_threads, config(so, "session.intra_op.allow_spinning"),
                         config(so, "session.force_spinning_stop")))
            super().__init__(model, so, **kwargs)

    monkeypatch.setattr(sessions.ort, "InferenceSession", Recorded)
    graph = _conv_graph()
    model = to_onnx(graph, Target(), batch=4)
    sess = session(model, threads=2, layout="measure")
    assert made == [(2, "1", "1")] * len(LAYOUTS) + [(2, "1", None)]
    data = np.random.default_rng(4).integers(-127, 128, (4, 3, 16, 16)).astype(np.int32)
    want = np.concatenate([execute(graph, {"data": data[i:i + 1]})[0] for i in range(4)])
    assert np.array_equal(sess.run(None, {"data": data})[0], want)
