# pytest for the Python module (ctest: python.pytest, label `python`, run by `make test`).
# The module is imported from the build tree: ctest sets PYTHONPATH=<build>/python; by hand,
#   PYTHONPATH=build/python python3 -m pytest tests/python
import os
import pathlib

import pytest

DATA = pathlib.Path(os.environ.get("TANDEM_TEST_DATA_DIR",
                                   pathlib.Path(__file__).resolve().parents[1] / "data"))


def data_path(*parts) -> pathlib.Path:
    p = DATA.joinpath(*parts)
    if not p.exists():  # missing data fails, it never skips
        raise FileNotFoundError(f"test data {p} is missing (copy it from ../shared, see README)")
    return p


@pytest.fixture(scope="session")
def tandem_bin() -> str:
    b = os.environ.get("TANDEM_BIN")
    if not b or not os.path.exists(b):
        raise FileNotFoundError("TANDEM_BIN (the tandem executable) is not set; ctest sets it")
    return b
