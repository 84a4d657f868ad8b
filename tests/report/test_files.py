"""report.files: outputs checked before the work, never overwritten silently, written atomically."""

from pathlib import Path

import pytest

from precision_doctor.errors import OutputExistsError, OutputPathError
from precision_doctor.report.files import check_folder, check_writable, write_text_atomic


def test_missing_folder_is_an_error_not_created(tmp_path: Path):
    target = tmp_path / "missing" / "r.html"
    with pytest.raises(OutputPathError, match="missing.*does not exist") as err:
        write_text_atomic(target, "x")
    assert err.value.context["file"] == str(target)
    assert list(tmp_path.iterdir()) == []


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
    with pytest.raises(OutputPathError, match="does not exist"):
        check_folder(tmp_path / "a" / "b")
    check_folder(tmp_path / "a")  # a missing folder with an existing parent is fine
