"""The ONNX toolkit (vitedge/onnxkit/): opset lookup, graph inputs, the producer/consumer
index, the topological sort and the ONNX Runtime session factory, on real small graphs run
by ONNX Runtime; and a scan of vitedge/ that fails when a second copy of one of them
reappears outside the toolkit."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.onnxkit.files import DATA_SUFFIX, EXTERNAL_DATA_ENV
from vitedge.onnxkit.session import SessionSettings, ort_session, session_source
from vitedge.onnxkit.structure import (
    graph_inputs,
    node_index,
    opset_imports,
    opset_version,
    require_opset_import,
    topological_sort,
)

REPO = Path(__file__).resolve().parents[2]
TOOLKIT = REPO / "vitedge" / "onnxkit"


def _value(name: str, shape=(2, 4)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _mlp(opset: int = 17, *, weights_as_inputs: bool = False, ir_version: int | None = None):
    """x -> MatMul(W) -> Add(b) -> Relu -> y; with ``weights_as_inputs`` W and b are also listed
    among the graph inputs, as graphs written for opset < 9 do."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["y"], name="relu"),
    ]
    inputs = [_value("x")] + ([_value("W", (4, 4)), _value("b", (4,))] if weights_as_inputs else [])
    graph = helper.make_graph(nodes, "mlp", inputs, [_value("y")], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def _names(nodes) -> list[str]:
    return [n.name for n in nodes]


# --------------------------------------------------------------------------- opset


def test_opset_version_reads_the_standard_domain_under_either_spelling_and_other_domains():
    model = _mlp(17)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert opset_version(model) == 17
    assert opset_version(model, "ai.onnx") == 17
    assert opset_version(model, "com.microsoft") == 1
    assert opset_version(model, "ai.onnx.ml") == 0
    spelled = _mlp(13)
    spelled.opset_import[0].domain = "ai.onnx"
    assert opset_version(spelled) == 13


def test_require_opset_import_adds_a_domain_once_and_keeps_an_existing_version():
    model = _mlp(17)
    require_opset_import(model, "com.microsoft", 1)
    require_opset_import(model, "com.microsoft", 2)
    require_opset_import(model, "", 19)
    assert sorted((o.domain, o.version) for o in opset_imports(model)) == [("", 17), ("com.microsoft", 1)]
    onnx.checker.check_model(model)


def test_opset_imports_build_a_runnable_model_from_part_of_a_graph():
    model = _mlp(17)
    part = helper.make_graph(list(model.graph.node)[:1], "part", [_value("x")], [_value("h")], initializer=[model.graph.initializer[0]])
    sub = helper.make_model(part, opset_imports=opset_imports(model))
    assert opset_version(sub) == 17
    x = np.ones((2, 4), np.float32)
    want = x @ numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(ort_session(sub).run(None, {"x": x})[0], want, rtol=1e-6)


# --------------------------------------------------------------------------- graph inputs


def test_graph_inputs_leave_out_initializers_listed_among_the_inputs():
    old = _mlp(8, weights_as_inputs=True, ir_version=3)
    onnx.checker.check_model(old)
    assert [i.name for i in old.graph.input] == ["x", "W", "b"]
    assert [i.name for i in graph_inputs(old)] == ["x"]
    assert [i.name for i in graph_inputs(old.graph)] == ["x"]  # a GraphProto works too
    # ONNX Runtime agrees: W and b are initializers one may override, x is the input to feed
    sess = ort_session(old)
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert sess.run(None, {"x": np.ones((2, 4), np.float32)})[0].shape == (2, 4)
    assert [i.name for i in graph_inputs(_mlp(17))] == ["x"]


def test_graph_inputs_keep_every_real_input_in_order():
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "two", [_value("a"), _value("b")], [_value("y")])
    assert [i.name for i in graph_inputs(helper.make_model(graph))] == ["a", "b"]


# --------------------------------------------------------------------------- node index


def test_node_index_lists_a_node_reading_a_tensor_twice_twice_and_skips_omitted_inputs():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "r"], ["sq"], name="square"),
        helper.make_node("Clip", ["sq", "", "hi"], ["c"], name="clip"),  # min omitted
        helper.make_node("Add", ["c", "r"], ["y"], name="add"),
    ]
    index = node_index(nodes)
    assert {t: n.name for t, n in index.producer.items()} == {"r": "relu", "sq": "square", "c": "clip", "y": "add"}
    assert [(n.name, i) for n, i in index.consumers["r"]] == [("square", 0), ("square", 1), ("add", 1)]
    assert _names(index.readers("r")) == ["square", "square", "add"]
    assert "" not in index.consumers and "" not in index.producer
    assert _names(index.readers("hi")) == ["clip"]  # an initializer / graph input is read, never written
    assert index.readers("y") == [] and "x" not in index.producer


# --------------------------------------------------------------------------- topological sort


def _chain():
    return [
        helper.make_node("Relu", ["x"], ["a"], name="n1"),
        helper.make_node("Abs", ["a"], ["b"], name="n2"),
        helper.make_node("Add", ["a", "b"], ["c"], name="n3"),
        helper.make_node("Mul", ["c", "x"], ["y"], name="n4"),
    ]


def test_topological_sort_keeps_a_sorted_list_as_it_is():
    nodes = _chain()
    assert _names(topological_sort(nodes)) == ["n1", "n2", "n3", "n4"]


def test_topological_sort_orders_an_unsorted_graph_that_then_checks_and_runs():
    nodes = _chain()
    graph = helper.make_graph(list(reversed(nodes)), "unsorted", [_value("x")], [_value("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)  # ONNX requires topological order
    ordered = topological_sort(model.graph.node)
    assert _names(ordered) == ["n1", "n2", "n3", "n4"]
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    onnx.checker.check_model(model)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    a = np.maximum(x, 0)
    np.testing.assert_allclose(ort_session(model).run(None, {"x": x})[0], 2 * a * x, rtol=1e-6)


def test_new_nodes_listed_first_land_right_after_the_tensor_they_read():
    """How a rewrite inserts nodes: a Q/DQ-like pair on ``a`` lands after its producer (and
    before ``a``'s first consumer), one on the graph input ``x`` stays in front."""
    nodes = _chain()
    q = helper.make_node("Identity", ["a"], ["a_q"], name="q_a")
    dq = helper.make_node("Identity", ["a_q"], ["a_dq"], name="dq_a")
    front = helper.make_node("Identity", ["x"], ["x_copy"], name="copy_x")
    nodes[1].input[0] = "a_dq"
    assert _names(topological_sort([dq, q, front, *nodes])) == ["copy_x", "n1", "q_a", "dq_a", "n2", "n3", "n4"]


def test_nodes_waiting_on_one_producer_follow_its_output_order_then_list_order():
    split = helper.make_node("Split", ["x"], ["s0", "s1"], axis=1, name="split")
    on_s1 = helper.make_node("Relu", ["s1"], ["r1"], name="on_s1")
    on_s0_a = helper.make_node("Neg", ["s0"], ["n0"], name="on_s0_a")
    on_s0_b = helper.make_node("Abs", ["s0"], ["a0"], name="on_s0_b")
    after_a = helper.make_node("Add", ["n0", "r1"], ["y"], name="after_a")
    ordered = topological_sort([after_a, on_s1, on_s0_a, on_s0_b, split])
    assert _names(ordered) == ["split", "on_s0_a", "on_s0_b", "on_s1", "after_a"]


def test_a_long_chain_listed_backwards_sorts_without_recursion_limits():
    n = 3000
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"r{i}") for i in range(n)]
    assert _names(topological_sort(reversed(nodes))) == [f"r{i}" for i in range(n)]


def test_a_cycle_is_a_clear_error():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"), helper.make_node("Neg", ["a"], ["b"], name="second")]
    with pytest.raises(ModelLoadError, match="cycle"):
        topological_sort(nodes)


# --------------------------------------------------------------------------- ONNX Runtime sessions


def test_session_defaults_are_onnx_runtime_defaults_with_quiet_logging(monkeypatch):
    monkeypatch.delenv("VITEDGE_ORT_SPINNING", raising=False)  # the test processes set it (tests/conftest.py); a user has not
    sess = ort_session(_mlp().SerializeToString())
    so = sess.get_session_options()
    assert so.log_severity_level == 3
    assert so.graph_optimization_level.name == "ORT_ENABLE_ALL"
    assert sess.get_providers() == ["CPUExecutionProvider"]
    for key in ("session.intra_op.allow_spinning", "session.disable_prepacking"):
        with pytest.raises(RuntimeError, match="does not have configuration"):
            so.get_session_config_entry(key)  # left at ONNX Runtime's default


def test_session_settings_reach_onnx_runtime(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save_model(_mlp(), str(path))
    optimized = tmp_path / "optimized.onnx"
    settings = SessionSettings(threads=1, optimization="basic", optimized_model_path=optimized, spinning=False, prepacking=False,
                               profile_prefix=str(tmp_path / "prof"))
    sess = ort_session(path, settings)
    so = sess.get_session_options()
    assert so.intra_op_num_threads == 1
    assert so.graph_optimization_level.name == "ORT_ENABLE_BASIC"
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.get_session_config_entry("session.disable_prepacking") == "1"
    assert optimized.is_file() and onnx.load(str(optimized)).graph.node
    sess.run(None, {"x": np.ones((2, 4), np.float32)})
    profile = Path(sess.end_profiling())
    assert profile.is_file() and profile.name.startswith("prof")
    # threads given beside the settings override theirs; "disabled" keeps the graph as written
    plain = ort_session(path, SessionSettings(optimization="disabled", threads=2), threads=1).get_session_options()
    assert plain.intra_op_num_threads == 1 and plain.graph_optimization_level.name == "ORT_DISABLE_ALL"


def test_session_from_a_large_model_proto_goes_through_external_data(monkeypatch):
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "wide", [_value("x", (2, 32))], [_value("y", (2, 32))],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "64")  # this small graph counts as past the 2 GiB limit
    x = np.ones((2, 32), np.float32)
    with session_source(model) as src:
        assert isinstance(src, str) and Path(src + DATA_SUFFIX).is_file()
    got = ort_session(model).run(None, {"x": x})[0]
    monkeypatch.delenv(EXTERNAL_DATA_ENV)
    np.testing.assert_array_equal(got, ort_session(model.SerializeToString()).run(None, {"x": x})[0])


def test_an_unknown_optimization_level_is_a_usage_error():
    with pytest.raises(UsageError, match="disabled, basic, extended, all"):
        SessionSettings(optimization="max")


def test_the_toolkit_imports_without_onnx_or_onnxruntime():
    """The runtime-only distribution ships the toolkit to boxes with neither installed."""
    code = ("import sys; sys.modules['onnx'] = None; sys.modules['onnxruntime'] = None\n"
            "import vitedge.onnxkit.files, vitedge.onnxkit.metadata, vitedge.onnxkit.structure\n"
            "import vitedge.onnxkit.graph as t, vitedge.onnxkit.session as s\n"
            "assert t.SessionSettings is s.SessionSettings; print(s.SessionSettings().optimization)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "all"


# --------------------------------------------------------------------------- no second copy

def _loop_target(target: ast.AST) -> str | None:
    return target.id if isinstance(target, ast.Name) else None


def _iterated(node: ast.AST, attr: str) -> ast.Attribute | None:
    """``<x>.<attr>`` for ``<x>.<attr>`` or ``enumerate(<x>.<attr>)``, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "enumerate" and node.args:
        node = node.args[0]
    return node if isinstance(node, ast.Attribute) and node.attr == attr else None


def _name_not_in(node: ast.AST, var: str | None) -> bool:
    """``<var>.name not in ...`` (a node's inputs are strings: only a graph's inputs have a .name)."""
    return (var is not None and isinstance(node, ast.Compare) and any(isinstance(op, ast.NotIn) for op in node.ops)
            and isinstance(node.left, ast.Attribute) and node.left.attr == "name"
            and isinstance(node.left.value, ast.Name) and node.left.value.id == var)


def _method_call(node: ast.AST, method: str) -> ast.Call | None:
    call = node.value if isinstance(node, ast.Expr) else None
    ok = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == method
    return call if ok else None


def _session_construction(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return f"onnxruntime.{name}(...) (use onnxkit.session.ort_session)" if name in ("InferenceSession", "SessionOptions") else None


def _opset_read(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr == "opset_import":
        return ".opset_import (use onnxkit.structure.opset_version / opset_imports / require_opset_import)"
    return None


def _graph_input_filter(node: ast.AST) -> str | None:
    hit = False
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        hit = any(_iterated(g.iter, "input") and any(_name_not_in(c, _loop_target(g.target)) for c in g.ifs) for g in node.generators)
    elif isinstance(node, ast.For) and _iterated(node.iter, "input"):
        hit = any(_name_not_in(inner, _loop_target(node.target)) for inner in ast.walk(node))
    return "graph inputs filtered by initializer names (use onnxkit.structure.graph_inputs)" if hit else None


def _producer_dict(node: ast.AST) -> str | None:
    """``{o: n for n in nodes for o in n.output}`` or ``for o in n.output: d[o] = n``."""
    hit = False
    if isinstance(node, ast.DictComp) and isinstance(node.value, ast.Name):
        hit = node.value.id in {_loop_target(g.target) for g in node.generators} and any(_iterated(g.iter, "output") for g in node.generators)
    elif isinstance(node, ast.For) and (outputs := _iterated(node.iter, "output")) is not None:
        owner, tensor = _loop_target(outputs.value), _loop_target(node.target)
        hit = owner is not None and any(
            isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and a.value.id == owner
            and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Name) and t.slice.id == tensor for t in a.targets)
            for a in ast.walk(node))
    return "tensor -> producer dict (use onnxkit.structure.node_index)" if hit else None


def _consumers_dict(node: ast.AST) -> str | None:
    """``for t in n.input: d.setdefault(t, []).append(...)`` or ``d[t].append(...)``."""
    if not (isinstance(node, ast.For) and _iterated(node.iter, "input")):
        return None
    names = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    for inner in ast.walk(node):
        call = _method_call(inner, "append")
        if call is None:
            continue
        holder = call.func.value
        if isinstance(holder, ast.Call) and isinstance(holder.func, ast.Attribute) and holder.func.attr == "setdefault" and holder.args:
            key = holder.args[0]
        else:
            key = holder.slice if isinstance(holder, ast.Subscript) else None
        if isinstance(key, ast.Name) and key.id in names:
            return "tensor -> consumers dict (use onnxkit.structure.node_index)"
    return None


def _splice_after_producer(node: ast.AST) -> str | None:
    """``for o in node.output: ordered.extend(after.get(o, ()))``."""
    if not (isinstance(node, ast.For) and _iterated(node.iter, "output")):
        return None
    for inner in ast.walk(node):
        call = _method_call(inner, "extend")
        arg = call.args[0] if call is not None and call.args else None
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "get":
            return "nodes spliced in after their producer (use onnxkit.structure.topological_sort)"
    return None


DETECTORS = (_session_construction, _opset_read, _graph_input_filter, _producer_dict, _consumers_dict, _splice_after_producer)


def _second_copies(source: str) -> list[str]:
    """The ONNX toolkit helpers re-implemented in ``source``, in their simplest detectable form."""
    return [f"line {node.lineno}: {hit}" for node in ast.walk(ast.parse(source)) for detect in DETECTORS
            if (hit := detect(node)) is not None]


# The copies this test was written against, as they were before the toolkit held them.
OLD_COPIES = {
    "session": "so = ort.SessionOptions()\nort.InferenceSession(str(p), so, providers=['CPUExecutionProvider'])",
    "opset": "max((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), default=0)",
    "inputs": "[i for i in graph.input if i.name not in inits][0]",
    "inputs_inline": "[i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}][0]",
    "inputs_next": "next(i.name for i in model.graph.input if i.name not in inits)",
    "inputs_loop": textwrap.dedent("""
        for inp in m.graph.input:
            if inp.name not in graph_inputs and dims:
                pass
    """),
    "inputs_named_otherwise": "graph_inputs = [i for i in model.graph.input if i.name not in inputs]",
    "producer": "producer = {o: n for n in g.node for o in n.output if o}",
    "producer_loop": textwrap.dedent("""
        for node in g.node:
            for out in node.output:
                if out:
                    producer[out] = node
    """),
    "consumers": textwrap.dedent("""
        for n in nodes:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
    """),
    "consumers_indexed": textwrap.dedent("""
        for node in g.node:
            for i, name in enumerate(node.input):
                if name:
                    consumers[name].append((node, i))
    """),
    "reorder": textwrap.dedent("""
        ordered = list(front)
        for node in g.node:
            ordered.append(node)
            for o in node.output:
                ordered.extend(after.get(o, ()))
    """),
}

# Code that touches the same protobuf fields for other reasons, which the scan must accept.
LEGITIMATE = textwrap.dedent("""
    used = {t.name for t in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
    ins = [i for i in node.input if i]
    fresh = [i for i in node.input if i not in seen]
    first = next(i for i in graph.input if i.name == wanted)
    for vi in list(g.input) + list(g.value_info):
        ranks[vi.name] = 1
    for i, name in enumerate(node.input):
        if name == out.name:
            node.input[i] = inner
    for o in node.output:
        done.add(o)
    todo.extend(o for o in node.output if o)
    names = {n.name: n for n in g.node}
    sess = ort_session(path, SessionSettings(threads=2))
""")


@pytest.mark.parametrize("kind", sorted(OLD_COPIES))
def test_the_scan_finds_each_old_copy(kind):
    expected = {"session": "onnxruntime.", "opset": ".opset_import", "inputs": "graph inputs", "producer": "producer dict",
                "consumers": "consumers dict", "reorder": "spliced"}[kind.split("_")[0]]
    hits = _second_copies(OLD_COPIES[kind])
    assert hits and all(expected in h for h in hits), hits


def test_the_scan_accepts_code_that_only_reads_the_same_fields():
    assert _second_copies(LEGITIMATE) == []


def test_no_second_copy_of_a_toolkit_helper_in_vitedge():
    found = []
    for path in sorted((REPO / "vitedge").rglob("*.py")):
        if TOOLKIT in path.parents:
            continue
        found += [f"{path.relative_to(REPO)} {hit}" for hit in _second_copies(path.read_text())]
    assert not found, "ONNX helpers re-implemented outside vitedge/onnxkit/:\n" + "\n".join(found)
