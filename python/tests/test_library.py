"""Loading librmmd_c.so: where it is looked for, and what a failure says."""

from __future__ import annotations

import os

from conftest import LIBRARY, run_python

import rmmd


def test_the_library_loads_with_its_version() -> None:
    assert rmmd.library_version() == rmmd.__version__
    assert os.path.samefile(rmmd.library_path(), LIBRARY)


def test_without_a_library_the_error_names_every_place_tried() -> None:
    env = dict(os.environ, RMMD_LIBRARY="/nonexistent/librmmd_c.so", LD_LIBRARY_PATH="")
    out = run_python(["-c", "import rmmd; rmmd.Session()"], env, check=False)
    assert out.returncode != 0
    assert "OSError: rmmd: cannot load librmmd_c.so; tried:" in out.stderr
    assert "/nonexistent/librmmd_c.so ($RMMD_LIBRARY): no such file" in out.stderr
    assert "rmmd/lib/librmmd_c.so (beside the package)" in out.stderr
    assert "(the system's library path)" in out.stderr


def test_a_directory_in_rmmd_library_is_searched() -> None:
    env = dict(os.environ, RMMD_LIBRARY=str(LIBRARY.parent))
    out = run_python(["-c", "import rmmd; print(rmmd.library_path())"], env)
    assert os.path.samefile(out.stdout.strip(), LIBRARY)


def test_the_framework_modules_import_without_their_framework() -> None:
    # They import here whether or not torch and cupy are installed; a use
    # without the framework says what is missing.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['cupy'] = None\n"
        "import rmmd.allocators.torch as t, rmmd.allocators.cupy as c\n"
        "for f in (t.rmmd_allocator, c.rmmd_allocator):\n"
        "    try:\n"
        "        f()\n"
        "    except ModuleNotFoundError as e:\n"
        "        print(e)\n"
    )
    out = run_python(["-c", code], dict(os.environ))
    assert "rmmd.allocators.torch needs PyTorch" in out.stdout
    assert "rmmd.allocators.cupy needs CuPy" in out.stdout


def test_a_library_beside_the_package_comes_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from conftest import PYTHON_DIR

    shutil.copytree(PYTHON_DIR / "rmmd", tmp_path / "rmmd")
    (tmp_path / "rmmd" / "lib").mkdir()
    shutil.copy2(LIBRARY, tmp_path / "rmmd" / "lib" / "librmmd_c.so")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), RMMD_LIBRARY="/nonexistent/librmmd_c.so")
    out = run_python(["-c", "import rmmd; print(rmmd.library_path())"], env)
    assert out.stdout.strip() == str(tmp_path / "rmmd" / "lib" / "librmmd_c.so")
