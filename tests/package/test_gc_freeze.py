"""tests/helpers/gc_freeze.py: the test processes freeze the objects of what they imported, once per batch of imports,
so the builds' full garbage collections walk only what the tests made since."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from conftest import REPO


def test_a_batch_of_imports_is_frozen_once_and_garbage_made_before_is_collected_first():
    script = textwrap.dedent("""
        import gc, sys
        sys.path.insert(0, sys.argv[1])
        from helpers import gc_freeze
        gc_freeze._frozen_at[0] = len(sys.modules)
        assert gc_freeze.freeze_if_imported() is False and gc.get_freeze_count() == 0  # nothing imported since
        class Cycle:
            pass
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b  # cyclic garbage: collected before the freeze, never frozen
        import json, email.mime.text, xml.dom.minidom, http.client, logging.handlers, unittest  # a batch of imports
        assert gc_freeze.freeze_if_imported(new_modules=10) is True
        frozen = gc.get_freeze_count()
        assert frozen > 0 and not any(type(o).__name__ == "Cycle" for o in gc.get_objects())
        assert gc_freeze.freeze_if_imported(new_modules=10) is False and gc.get_freeze_count() == frozen  # once per batch
        assert len(gc.get_objects()) < frozen  # a full collection no longer walks them
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(REPO / "tests")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_the_test_processes_use_the_hooks():
    import conftest

    from helpers import gc_freeze

    assert conftest.pytest_runtest_setup is gc_freeze.pytest_runtest_setup
    assert conftest.pytest_fixture_setup is gc_freeze.pytest_fixture_setup
    assert gc.get_freeze_count() > 0  # this process froze what its collection imported
