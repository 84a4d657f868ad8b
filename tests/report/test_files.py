"""report.files: outputs checked before the work, never overwritten silently, written atomically."""

from pathlib import Path

import onnx
import pytest

from precision_doctor.errors import OutputExistsError, OutputPathError
from precision_doctor.report.files import (
    check_folder,
    check_writable,
    write_model,
    write_text_atomic,
)


def test_missing_folders_are_created_at_write_time(tmp_path: Path):
    target = tmp_path / "missing" / "deeper" / "r.html"
    check_writable([target], False)  # nothing is created by the check
    assert list(tmp_path.iterdir()) == []
    write_text_atomic(target, "x")
    assert target.read_text() == "x"
    assert [p.name for p in target.parent.iterdir()] == ["r.html"]  # no temporary file left


def test_missing_folder_models_are_created(tmp_path: Path):
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    target = tmp_path / "new" / "folder" / "m.onnx"
    assert write_model(target, model) == [target]
    assert onnx.load(str(target)).graph.node[0].op_type == "Relu"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_unwritable_place_is_refused_before_anything_is_made():
    """``os.access`` says yes to root in ``/proc``; the probe file finds out."""
    for target in (Path("/proc/precision-doctor-x/m.onnx"), Path("/proc/m.onnx")):
        with pytest.raises(OutputPathError, match="folder /proc is not writable") as err:
            check_writable([target], False)
        assert err.value.context["file"] == str(target)
        with pytest.raises(OutputPathError, match="/proc"):
            write_text_atomic(target, "x")
    with pytest.raises(OutputPathError, match="not writable"):
        check_folder("/proc/precision-doctor-x")


def test_a_file_on_the_way_is_refused(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputPathError, match="f is a file, not a folder"):
        check_writable([tmp_path / "f" / "sub" / "r.json"], False)
    with pytest.raises(OutputPathError, match="not a folder"):
        check_folder(tmp_path / "f" / "sub")


def test_existing_file_needs_force_and_is_replaced_whole(tmp_path: Path):
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(OutputExistsError):
        write_text_atomic(target, "new")
    write_text_atomic(target, "new", force=True)
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_inputs_and_folders(tmp_path: Path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model")
    link = tmp_path / "link.onnx"
    link.symlink_to(model)
    with pytest.raises(OutputPathError, match="input"):
        check_writable([link], True, inputs=[model])
    with pytest.raises(OutputPathError, match="is a folder"):
        check_writable([tmp_path], True)
    out = tmp_path / "new" / "sub" / "x.png"  # inside a folder the caller will create
    check_writable([out], False, folders=[tmp_path / "new"])
    with pytest.raises(OutputPathError, match="not a folder"):
        check_folder(model)
    check_folder(tmp_path / "a")  # a missing folder (the caller creates it) is fine
    check_folder(tmp_path / "a" / "b")  # at any depth
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.onnx", "m.onnx"]  # no probe left
