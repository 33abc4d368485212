"""Environment values by type (megatron_env.redact.envtypes): a value shows only where it parses
as what its variable can hold, per the grammar its library documents; anything else, and the
value of a name the table does not know under a prefix it governs, shows as its shape.

Values are drawn by the grammars' categories (hypothesis), never listed: interface lists, HCA
lists, GPU lists with UUIDs and MIG ids, Slurm host lists and task counts, host:port, sizes,
switches, levels; secrets are drawn as what does not parse (random strings, and passphrases of
words that a shape test would keep).
"""

from __future__ import annotations

import json
import random
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env import redact
from megatron_env.redact import envtypes

from . import redact_grammar as grammar

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True)

_nic = st.builds(lambda p, n, s: p + str(n) + s, st.sampled_from(["eth", "ib", "enp", "bond",
                                                                   "ens", "eno"]),
                 st.integers(0, 300), st.sampled_from(["", "s0", "s0np0", "f1", ".100"]))
_ifaces = st.builds(lambda lead, xs: lead + ",".join(xs), st.sampled_from(["", "^", "=", "^="]),
                    st.lists(_nic, min_size=1, max_size=4))
_hca = st.builds(lambda d, n, port: f"{d}_{n}" + (f":{port}" if port else ""),
                 st.sampled_from(["mlx5", "mlx4", "bnxt_re", "irdma"]), st.integers(0, 17),
                 st.sampled_from([0, 1, 2]))
_hcas = st.builds(lambda lead, xs: lead + ",".join(xs), st.sampled_from(["", "^", "="]),
                  st.lists(_hca, min_size=1, max_size=4))
_uuid = st.uuids().map(str)
_gpu = st.one_of(st.integers(0, 15).map(str), _uuid.map(lambda u: "GPU-" + u),
                 _uuid.map(lambda u: "GPU-" + u[:8]),
                 st.builds(lambda u, g, c: f"MIG-{u}/{g}/{c}", _uuid, st.integers(0, 14),
                           st.integers(0, 7)))
_gpus = st.lists(_gpu, min_size=1, max_size=8).map(",".join)
_node = st.builds(lambda base, rng: base + rng, st.sampled_from(["node", "gpu-a", "dgx", "hgx-"]),
                  st.one_of(st.integers(1, 999).map(lambda n: f"{n:03d}"),
                            st.builds(lambda a, b: f"[{a:02d}-{a + b:02d},{a + b + 2:02d}]",
                                      st.integers(0, 40), st.integers(1, 9))))
_nodes = st.lists(_node, min_size=1, max_size=3).map(",".join)
_tasks = st.lists(st.builds(lambda n, x: f"{n}" + (f"(x{x})" if x else ""), st.integers(1, 8),
                            st.integers(0, 16)), min_size=1, max_size=3).map(",".join)
_size = st.builds(lambda n, u: f"{n}{u}", st.integers(1, 1 << 30),
                  st.sampled_from(["", "K", "M", "G", "k", "KiB", "MB"]))
_host = st.one_of(st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", *[st.integers(0, 255)] * 4),
                  _node.filter(lambda n: "[" not in n))

# (a variable of the table, values of its grammar)
TYPED = [
    ("NCCL_SOCKET_IFNAME", _ifaces), ("GLOO_SOCKET_IFNAME", _ifaces), ("NCCL_IB_HCA", _hcas),
    ("UCX_NET_DEVICES", _hcas), ("CUDA_VISIBLE_DEVICES", _gpus), ("NVIDIA_VISIBLE_DEVICES", _gpus),
    ("SLURM_JOB_NODELIST", _nodes), ("SLURM_TASKS_PER_NODE", _tasks),
    ("NCCL_BUFFSIZE", _size), ("UCX_RNDV_THRESH", _size),
    ("MASTER_ADDR", _host), ("MASTER_PORT", st.integers(1, 65535).map(str)),
    ("NCCL_COMM_ID", st.builds(lambda h, p: f"{h}:{p}", _host, st.integers(1, 65535))),
    ("NCCL_DEBUG", st.sampled_from(["VERSION", "WARN", "INFO", "TRACE", "warn", "info"])),
    ("NCCL_DEBUG_SUBSYS", st.lists(st.sampled_from(["INIT", "COLL", "NET", "GRAPH", "ENV"]),
                                   min_size=1, max_size=4).map(",".join)),
    ("NCCL_P2P_LEVEL", st.sampled_from(["0", "1", "4", "NVL", "PIX", "PXB", "SYS"])),
    ("NCCL_IB_DISABLE", st.sampled_from(["0", "1"])),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", st.integers(0, 10 ** 7).map(str)),
    ("PYTORCH_CUDA_ALLOC_CONF", st.lists(st.sampled_from([
        "expandable_segments:True", "max_split_size_mb:512", "garbage_collection_threshold:0.6",
        "backend:cudaMallocAsync"]), min_size=1, max_size=3, unique=True).map(",".join)),
    ("UCX_TLS", st.lists(st.sampled_from(["rc", "ud", "sm", "self", "cuda_copy", "cuda_ipc",
                                          "tcp"]), min_size=1, max_size=4, unique=True).map(
        ",".join)),
]
# a random secret as tests/redact_grammar draws one (letters, digits, symbols, 14-28 long), from
# a seed (a shrunk draw stays a random string, never `aaaa...`)
_random = st.integers(0, 2 ** 32).map(lambda seed: grammar.secret(random.Random(seed)))
_passphrase = st.lists(st.sampled_from(["sunflower", "marigold", "lighthouse", "peppermint",
                                        "dragonfly", "moonbeam"]), min_size=3, max_size=4,
                       unique=True).map(lambda ws: "-".join(ws) + "-42")
SECRET = st.one_of(_random, _passphrase)
# a passphrase of words parses as a name or a host (`sunflower-marigold-42` is a valid node
# name): only the grammars that hold no words reject it
WORDLESS = ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "CUDA_VISIBLE_DEVICES", "MASTER_PORT",
            "NCCL_DEBUG", "NCCL_BUFFSIZE", "NCCL_P2P_LEVEL", "SLURM_TASKS_PER_NODE",
            "PYTORCH_CUDA_ALLOC_CONF", "UCX_TLS", "NCCL_IB_DISABLE"]


@SETTINGS
@given(case=st.sampled_from(TYPED).flatmap(lambda t: st.tuples(st.just(t[0]), t[1])),
       secret=_random)
def test_the_value_decides_under_the_same_name(case: tuple[str, str], secret: str) -> None:
    """A value of the variable's grammar shows as it is, a secret under the same name as its
    shape: names alone decide nothing."""
    name, value = case
    assert redact.variables({name: value}) == {name: value}
    assert redact.text(f"export {name}={value}", {}) == f"export {name}={value}"
    assert redact.variables({name: secret}) == {name: f"<redacted: {len(secret)} chars>"}


@SETTINGS
@given(case=st.one_of(
    st.tuples(st.sampled_from([n for n, _ in TYPED] + ["NCCL_NET_PLUGIN", "SLURM_JOB_NAME",
                                                       "CUDA_HOME", "NCCL_TOPO_FILE"]),
              _random),
    st.tuples(st.sampled_from(WORDLESS), _passphrase)))
def test_a_value_that_does_not_parse_shows_its_shape(case: tuple[str, str]) -> None:
    """An NCCL_-named copy of a credential: the value does not parse as what the variable holds,
    so it is printed as its length wherever the tool prints a variable (in a text, a pass
    before may already have masked it: then no part of it shows either)."""
    name, value = case
    shape = f"<redacted: {len(value)} chars>"
    assert redact.variables({name: value}) == {name: shape}
    assert json.loads(redact.text(json.dumps({name: value}), {})) == {name: shape}
    line = redact.text(f"{name}={value}", {})
    assert "<redacted" in line and not grammar.leaked(line, value), line
    # a file of them (collect's env.txt) is written through the redaction again: unchanged
    assert redact.text(f"{name}={shape}\n", {}) == f"{name}={shape}\n"


@SETTINGS
@given(suffix=st.text(alphabet=string.ascii_uppercase + "_", min_size=3, max_size=20).filter(
           lambda s: f"NCCL_{s}" not in envtypes.TABLE and not redact.is_secret_name(s)),
       value=st.one_of(SECRET, _ifaces, _hcas))
def test_an_unknown_nccl_name_is_unknown(suffix: str, value: str) -> None:
    """A name the table does not hold under a prefix it governs shows nothing of its value but
    what no name makes secret (an empty value, a switch, a short integer)."""
    name = f"NCCL_{suffix}"
    assert redact.variables({name: value}) == {name: f"<redacted: {len(value)} chars>"}
    assert redact.variables({name: "1"}) == {name: "1"}


def test_a_secret_names_value_stays_masked_and_a_urls_password_is_masked_in_place() -> None:
    env = {"NCCL_IB_PRIVATE_KEY": "hunter2hunter2", "NCCL_TOPO_FILE": "hunter2hunter2",
           "MEGATRON_ENV_MIRROR_PYPI": "https://alice:pw1234567@mirror.example.org/simple"}
    assert redact.variables(env) == {
        "MEGATRON_ENV_MIRROR_PYPI": "https://***@mirror.example.org/simple",
        "NCCL_IB_PRIVATE_KEY": "<redacted>", "NCCL_TOPO_FILE": "<redacted>"}


def test_every_grammar_of_the_table_rejects_a_random_secret() -> None:
    """No grammar of the table takes a random string of letters, digits and symbols: each
    variable's value is judged, none passes whatever it holds."""
    value = "Xk9vQ2mZ8pL4nR7t%Y3wB5jH"
    passing = sorted(n for n in envtypes.TABLE if envtypes.parses(n, value))
    assert passing == []
