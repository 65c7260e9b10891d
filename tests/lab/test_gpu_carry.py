"""deliverables.gpu.carry: the wheels the offline GPU run carries cover what pyproject.toml needs beyond the machine's
image, and what those wheels need in turn; the files in .whl/ are the listed ones and pip would install them for
the offline machine's Python 3.12."""

import dataclasses

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deliverables.gpu import carry


def test_the_carried_wheels_cover_pyproject_and_their_own_requirements():
    wheels, image, deps = carry.read_manifest(), carry.read_image(), carry.dependencies()
    assert carry.coverage_problems(wheels, image, deps) == []
    # exactly the dependencies the image lacks are carried, and nothing the image has
    missing = {canonicalize_name(Requirement(d).name) for d in deps} - set(image)
    assert missing == {"grain", "qwix", "tomli-w"} and missing <= {w.name for w in wheels}
    assert not {w.name for w in wheels} & set(image)
    assert sum(w.size for w in wheels) < 16 * 2**20  # well inside the 64 MiB the working tree may carry


def test_coverage_problems_name_what_is_missing():
    wheels, image = carry.read_manifest(), carry.read_image()
    without = [w for w in wheels if w.name != "portpicker"]
    assert carry.coverage_problems(without, image, ["grain"]) == [
        "grain==0.2.18 needs portpicker: neither on the image (image.txt) nor carried (wheels.txt)"]
    assert carry.coverage_problems(wheels, image, ["numpy<2"]) == ["pyproject.toml needs numpy<2: numpy 2.5.2 is there"]
    assert "twice" in carry.coverage_problems([*wheels, dataclasses.replace(wheels[0], requirement="grain==0.2.17")],
                                              image, [])[0]
    assert carry.coverage_problems(wheels, image, ['pywin32; sys_platform == "win32"']) == []  # not on Linux


def test_requirements_are_normalised_for_the_offline_machine():
    assert carry.normalise('array-record>=0.8.1; sys_platform != "win32"') == "array-record>=0.8.1"
    assert carry.normalise('pyarrow; extra == "parquet"') is None
    assert carry.normalise("etils[epy,epath]") == "etils[epath,epy]"
    assert carry.normalise('tomli; python_version < "3.11"') is None


@pytest.mark.skipif(not carry.FOLDER.is_dir(), reason=".whl/ is downloaded by `python -m deliverables.gpu.carry "
                    "download` before an offline run; absent here")
def test_the_downloaded_wheels_are_the_listed_ones_and_install_for_python_3_12():
    assert carry.file_problems(carry.read_manifest(), carry.FOLDER) == []
    assert carry.resolves(carry.FOLDER) is None


def test_a_wheel_that_is_not_listed_or_differs_is_named(tmp_path):
    wheels = carry.read_manifest()
    (tmp_path / wheels[-1].file).write_bytes(b"not a wheel")
    (tmp_path / "other-1.0-py3-none-any.whl").write_bytes(b"")
    problems = carry.file_problems(wheels, tmp_path)
    assert f"{tmp_path / wheels[0].file}: missing (python -m deliverables.gpu.carry download)" in problems
    assert f"{tmp_path / wheels[-1].file}: not the file wheels.txt lists (size or sha256 differs)" in problems
    assert problems[-1].endswith("wheels not in wheels.txt (other-1.0-py3-none-any.whl): remove them (one version "
                                 "of each)")
