"""The folder rule holds for every tensor a graph holds, not only initializers (issue 46, class 2).

An ONNX graph may keep a Constant node's value, any tensor attribute, a subgraph's initializer (If, Loop, Scan) or a
sparse initializer in an external file. vitedge checked initializers only: such a tensor's relative location was
kept as written, so the file was read from wherever the graph was next opened (the working directory of
`vitedge calibrate`), and a location outside the model's folder was not refused at all. Every case runs the CLI and
asserts the exit code, the one line, that nothing was written and that no file changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CALIB_DIR, EXAMPLES
from onnx import TensorProto, helper, numpy_helper
from rel_cli import cli

CLASSES = 10


@pytest.fixture(scope="module")
def fp32_graph(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fp32")
    result = cli("export", EXAMPLES / "digits_vit.pt", "-o", root / "m.onnx")
    assert result.code == 0, result.err
    return root / "m.onnx"


def _external(name: str, values: np.ndarray, location: str, offset: str = "0", length: str | None = None) -> onnx.TensorProto:
    values = values.astype(np.float32)
    tensor = numpy_helper.from_array(values, name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", length or str(values.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _with_bias(fp32: Path, folder: Path, place: str, location: str, **info) -> Path:
    """``fp32`` with ``logits = pre_logits + bias``, the bias an external tensor at ``location`` kept in ``place``."""
    model = onnx.load(str(fp32))
    graph = model.graph
    out = graph.output[0].name
    for node in graph.node:
        node.output[:] = ["pre_logits" if o == out else o for o in node.output]
    bias = _external("bias", np.zeros(CLASSES), location, **info)
    if place == "constant":
        graph.node.append(helper.make_node("Constant", [], ["bias_out"], value=bias))
    elif place == "subgraph":
        branch = helper.make_graph([helper.make_node("Constant", [], ["b"], value=bias)], "branch", [],
                                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, [CLASSES])])
        graph.node.append(helper.make_node("Constant", [], ["yes"], value=helper.make_tensor("yes", TensorProto.BOOL, [], [True])))
        graph.node.append(helper.make_node("If", ["yes"], ["bias_out"], then_branch=branch, else_branch=branch))
    elif place == "sparse":
        indices = numpy_helper.from_array(np.arange(CLASSES, dtype=np.int64), "bias_idx")
        graph.sparse_initializer.append(helper.make_sparse_tensor(bias, indices, [CLASSES]))
        graph.node.append(helper.make_node("Identity", ["bias"], ["bias_out"]))
    graph.node.append(helper.make_node("Add", ["pre_logits", "bias_out"], [out]))
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "m.onnx"))
    return folder / "m.onnx"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _calibrate(model: Path, out: Path, cwd: Path, cache: Path):
    return cli("calibrate", model, "--calib", CALIB_DIR, "-o", out, "--cache-dir", cache, "--calib-size", "16", cwd=cwd)


def _refused(result, *fragments: str) -> str:
    assert result.code == 2, result.err[-2000:]
    lines = result.lines
    assert len(lines) == 1 and "Traceback" not in result.err, result.err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("place", ["constant", "subgraph"])
def test_a_constants_data_is_read_from_the_models_folder_not_the_working_directory(fp32_graph, tmp_path, place):
    model = _with_bias(fp32_graph, tmp_path / "model", place, "bias.bin")
    work = tmp_path / "work"
    work.mkdir()
    (work / "bias.bin").write_bytes(np.full(CLASSES, 1e6, np.float32).tobytes())  # a same-named file where the user stands
    before = _files(tmp_path)
    result = _calibrate(model, tmp_path / "q.onnx", work, tmp_path.parent / f"cache-{tmp_path.name}")
    _refused(result, str(model), "tensor 'bias' keeps its weights in 'bias.bin', which is missing from", str(model.parent))
    assert _files(tmp_path) == before and not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("place", ["constant", "subgraph", "sparse"])
@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_tensor_outside_the_initializers_naming_a_file_outside_the_folder_is_refused(fp32_graph, tmp_path, place, where):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(CLASSES, 7, np.float32).tobytes())
    location = "../secret.bin" if where == "parent" else str(secret)
    model = _with_bias(fp32_graph, tmp_path / "model", place, location)
    before = _files(tmp_path)
    result = _calibrate(model, tmp_path / "q.onnx", tmp_path, tmp_path.parent / f"cache-{tmp_path.name}")
    _refused(result, str(model), f"names external data '{location}', which is not a file inside the model's folder")
    assert _files(tmp_path) == before and not (tmp_path / "q.onnx").exists()


def test_a_constants_data_beside_the_model_is_the_one_the_output_holds(fp32_graph, tmp_path):
    model = _with_bias(fp32_graph, tmp_path / "model", "constant", "bias.bin")
    mine = np.linspace(-1, 1, CLASSES).astype(np.float32)
    (model.parent / "bias.bin").write_bytes(mine.tobytes())
    work = tmp_path / "work"
    work.mkdir()
    (work / "bias.bin").write_bytes(np.full(CLASSES, 1e6, np.float32).tobytes())
    result = _calibrate(model, tmp_path / "q.onnx", work, tmp_path.parent / f"cache-{tmp_path.name}")
    assert result.code == 0, result.err[-2000:]
    out = onnx.load(str(tmp_path / "q.onnx"), load_external_data=False)
    [value] = [n.attribute[0].t for n in out.graph.node if n.op_type == "Constant" and n.attribute[0].t.name == "bias"]
    assert value.data_location == TensorProto.DEFAULT and not value.external_data  # inline: opens anywhere the same
    assert np.array_equal(numpy_helper.to_array(value), mine)
    assert not any(p.name == "bias.bin" for p in tmp_path.iterdir())
