"""The bundled data is found as the CLI finds it (feplb/sim/data_dir.h): FEPLB_DATA_DIR, then the
package's own copy, then an installed share/feplb/data, then the repository's data/."""

import os
import shutil

import pytest

import feplb
from feplb import _data


def test_the_repository_data_is_found_in_a_build_tree():
    assert os.path.isfile(feplb.default_trace_path())
    assert os.path.isdir(os.path.join(feplb.data_dir(), "cost"))
    places = _data.data_search_path()
    assert places[-1].endswith("data")  # the source tree's, last
    assert os.path.join(os.path.dirname(_data.__file__), "data") in places


def test_feplb_data_dir_comes_first(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "traces")
    shutil.copy(feplb.default_trace_path(), tmp_path / "traces" / "default.json")
    monkeypatch.setenv("FEPLB_DATA_DIR", str(tmp_path))
    assert _data.data_search_path()[0] == str(tmp_path)
    assert feplb.default_trace_path() == str(tmp_path / "traces" / "default.json")
    # Without cost/ there, the measured tables still come from the next place that has them.
    assert feplb.data_dir() != str(tmp_path)


def test_a_file_nowhere_is_a_value_error_listing_the_places(tmp_path, monkeypatch):
    monkeypatch.setenv("FEPLB_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="bundled data: traces/none.json not found in: ") as e:
        feplb._feplb.find_data("traces/none.json", [])
    assert str(tmp_path) in str(e.value)
