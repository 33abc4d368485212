"""megatron_env.proc: the one subprocess runner."""

import gc
import warnings

from megatron_env import proc


def test_stdin_file_is_fed_and_closed(tmp_path):
    f = tmp_path / "in"
    f.write_text("hello")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        r = proc.run(["cat"], stdin_file=f)
        gc.collect()
    assert r.ok and r.stdout == "hello"
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]
    assert proc.run(["cat"], input="x", stdin_file=f).stdout == "x"  # input wins, as before
