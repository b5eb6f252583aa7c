"""Pulling by name with the real huggingface_hub client against tests/hub_server.py (tiny fake GGUF files)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from cllm.core.gguf_meta import STRING
from cllm.hub.pull import Hub, HubError
from cllm.hub.store import repo_folder
from perf.gguf_io import header
from tests.conftest import ROOT
from tests.hub_server import TOKEN, FakeHub, Repo
from tests.unit.test_gguf_check import BAD

MIB = 1 << 20
I8 = 24  # GGML_TYPE_I8
CRAFTED = ("cut in the data", "offset past the end", "absurd tensor count", "overlap")


def gguf(tag: str, size: int = 3 * MIB) -> bytes:
    """A sound GGUF file of `size` bytes (one int8 tensor filling it), different for every tag."""
    seed = hashlib.sha256(tag.encode()).digest()
    n = size - len(header({"general.name": (STRING, tag)}, [("data", (0,), I8, 0)])[0])
    head, _ = header({"general.name": (STRING, tag)}, [("data", (n,), I8, n)])
    return head + (seed * (n // len(seed) + 1))[:n]


TINY = {
    "README.md": b"# tiny\n",
    "tiny-Q4_K_M.gguf": gguf("Q4_K_M"),
    "tiny-Q8_0.gguf": gguf("Q8_0", MIB),
    "tiny-IQ2_XS-00001-of-00002.gguf": gguf("IQ2_XS.1", MIB),
    "tiny-IQ2_XS-00002-of-00002.gguf": gguf("IQ2_XS.2", MIB // 2),
    "mmproj-tiny-F16.gguf": gguf("mmproj", MIB // 4),
    "tiny-F16.gguf": gguf("F16", 12 * MIB),  # over huggingface_hub's 10 MiB chunk: a cut after it resumes past it
}


@pytest.fixture
def hub(monkeypatch):
    # huggingface_hub's User-Agent telemetry would ask the default endpoint (huggingface.co) for its agent list
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # the stand-in is reachable
    repos = {
        "cllm-test/tiny-GGUF": Repo(dict(TINY)),
        "cllm-test/private-GGUF": Repo(dict(TINY), private=True),
        "cllm-test/gated-GGUF": Repo(dict(TINY), gated=True),
        **{f"cllm-test/crafted-{i}-GGUF": Repo({"x-Q4_K_M.gguf": bytes(BAD[c][0]())}) for i, c in enumerate(CRAFTED)},
    }
    with FakeHub(repos) as h:
        yield h


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def client(hub: FakeHub, tmp_path, **kw) -> Hub:
    """A client of the stand-in that ignores this machine's HF_TOKEN, stored token and HF_HUB_OFFLINE."""
    return Hub(endpoint=hub.endpoint, cache_dir=str(tmp_path / "hub"), **{"token": False, "offline": False, **kw})


def test_a_pull_lands_in_the_cache_layout_with_mmproj_and_a_second_downloads_nothing(hub, tmp_path):
    h = client(hub, tmp_path)
    got = h.pull("cllm-test/tiny-GGUF:q4_k_m")
    assert got.name == "cllm-test/tiny-GGUF:Q4_K_M" and got.fetched == len(TINY["tiny-Q4_K_M.gguf"]) + len(
        TINY["mmproj-tiny-F16.gguf"]
    )
    folder = repo_folder(h.cache_dir, "cllm-test/tiny-GGUF")
    commit = hub.repos["cllm-test/tiny-GGUF"].commit
    assert got.path == os.path.join(folder, "snapshots", commit, "tiny-Q4_K_M.gguf") and os.path.islink(got.path)
    sha = hashlib.sha256(TINY["tiny-Q4_K_M.gguf"]).hexdigest()
    assert os.path.realpath(got.path) == os.path.join(folder, "blobs", sha)
    assert read(got.path) == TINY["tiny-Q4_K_M.gguf"] and read(got.mmproj) == TINY["mmproj-tiny-F16.gguf"]
    assert read(os.path.join(folder, "refs", "main")) == commit.encode()
    # huggingface_hub's own reader of the cache finds the file where cllm put it
    from huggingface_hub import try_to_load_from_cache

    assert try_to_load_from_cache("cllm-test/tiny-GGUF", "tiny-Q4_K_M.gguf", cache_dir=h.cache_dir) == got.path

    hub.log.clear()
    again = h.pull("cllm-test/tiny-GGUF:Q4_K_M")
    assert again == got.__class__(**{**got.__dict__, "fetched": 0})
    assert [m for m, p, r in hub.log] == ["GET"] and hub.log[0][1].startswith("/api/models/")  # the listing only


def test_without_a_tag_the_default_and_a_missing_tag_lists_the_repo(hub, tmp_path):
    assert client(hub, tmp_path).pull("cllm-test/tiny-GGUF").name == "cllm-test/tiny-GGUF:Q4_K_M"
    with pytest.raises(Exception) as e:
        client(hub, tmp_path).pull("cllm-test/tiny-GGUF:Q5_K_M")
    assert "Q5_K_M" in str(e.value) and "IQ2_XS: tiny-IQ2_XS-00001-of-00002.gguf (2 parts)" in str(e.value)


def test_a_split_model_comes_down_whole(hub, tmp_path):
    got = client(hub, tmp_path).pull("cllm-test/tiny-GGUF:iq2_xs")
    assert [os.path.basename(p) for p in got.files] == [
        "tiny-IQ2_XS-00001-of-00002.gguf",
        "tiny-IQ2_XS-00002-of-00002.gguf",
    ]
    assert got.path == got.files[0] and all(read(p) == TINY[os.path.basename(p)] for p in got.files)


def test_a_cut_connection_resumes_from_where_it_stopped(hub, tmp_path):
    hub.cut_after = 11 * MIB
    got = client(hub, tmp_path).pull("cllm-test/tiny-GGUF:F16")
    data = TINY["tiny-F16.gguf"]
    assert read(got.path) == data
    model = [r for p, r in hub.downloads() if p.endswith(hashlib.sha256(data).hexdigest())]
    assert model == [None, f"bytes={10 * MIB}-"]  # the retry asked for what the last whole chunk did not hold
    assert hub.sent == 11 * MIB + len(data) - 10 * MIB + len(TINY["mmproj-tiny-F16.gguf"])


def test_a_pull_stopped_in_an_earlier_run_resumes(hub, tmp_path):
    h = client(hub, tmp_path)
    data = TINY["tiny-Q4_K_M.gguf"]
    sha = hashlib.sha256(data).hexdigest()
    blobs = os.path.join(repo_folder(h.cache_dir, "cllm-test/tiny-GGUF"), "blobs")
    os.makedirs(blobs)
    with open(os.path.join(blobs, sha + ".incomplete"), "wb") as f:
        f.write(data[: 2 * MIB])  # what a killed pull left
    got = h.pull("cllm-test/tiny-GGUF:Q4_K_M")
    assert read(got.path) == data and got.fetched == len(data) - 2 * MIB + len(TINY["mmproj-tiny-F16.gguf"])
    assert (f"/lfs/{sha}", f"bytes={2 * MIB}-") in hub.downloads()


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("corrupt", "does not match the hub's checksum.*removed and not served"),  # one byte flipped, same length
        ("short", "tiny-Q8_0.gguf of cllm-test/tiny-GGUF did not download whole.*removed"),  # one byte less
    ],
)
def test_a_corrupted_or_short_file_is_refused_and_removed_never_served(hub, tmp_path, fault, said):
    h = client(hub, tmp_path)
    setattr(hub, fault, True)
    with pytest.raises(HubError, match=said):
        h.pull("cllm-test/tiny-GGUF:Q8_0")
    folder = repo_folder(h.cache_dir, "cllm-test/tiny-GGUF")
    left = [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]
    assert not [p for p in left if "/blobs/" in p or "/snapshots/" in p], left
    with pytest.raises(HubError):
        Hub(cache_dir=h.cache_dir, offline=True).pull("cllm-test/tiny-GGUF:Q8_0")
    setattr(hub, fault, False)
    assert read(h.pull("cllm-test/tiny-GGUF:Q8_0").path) == TINY["tiny-Q8_0.gguf"]


@pytest.mark.parametrize("case", range(len(CRAFTED)))
def test_a_crafted_gguf_is_refused_with_its_reason_and_removed(hub, tmp_path, case):
    """The hub's checksum fits these files: only the GGUF check stands between them and llama.cpp's loader."""
    h = client(hub, tmp_path)
    with pytest.raises(HubError, match=f"x-Q4_K_M.gguf of .* is not a sound GGUF file: .*{BAD[CRAFTED[case]][1]}"):
        h.pull(f"cllm-test/crafted-{case}-GGUF:Q4_K_M")
    folder = repo_folder(h.cache_dir, f"cllm-test/crafted-{case}-GGUF")
    assert not [n for _, _, names in os.walk(folder) for n in names]


def test_a_gated_repo_says_to_accept_its_terms(hub, tmp_path):
    with pytest.raises(HubError) as e:
        client(hub, tmp_path, token=TOKEN).pull("cllm-test/gated-GGUF:Q8_0")
    assert str(e.value) == (
        f"cllm-test/gated-GGUF is a gated repo: accept its terms at {hub.endpoint}/cllm-test/gated-GGUF, "
        "then set HF_TOKEN (or `hf auth login`) to a token that may read it"
    )


def test_404_and_401_are_one_sentence_naming_the_repo(hub, tmp_path):
    with pytest.raises(HubError) as e:
        client(hub, tmp_path, token=TOKEN).pull("cllm-test/nothing-GGUF")
    assert (
        str(e.value).startswith("cllm-test/nothing-GGUF was not found on")
        and "HTTP 404" in str(e.value)
        and "\n" not in str(e.value)
    )
    with pytest.raises(HubError) as e:
        client(hub, tmp_path).pull("cllm-test/private-GGUF:Q8_0")
    assert "cllm-test/private-GGUF" in str(e.value) and "HTTP 401" in str(e.value) and "HF_TOKEN" in str(e.value)
    with pytest.raises(HubError, match="refused the token for cllm-test/private-GGUF.*HF_TOKEN"):
        client(hub, tmp_path, token="hf_wrong").pull("cllm-test/private-GGUF:Q8_0")
    assert client(hub, tmp_path, token=TOKEN).pull("cllm-test/private-GGUF:Q8_0").name == "cllm-test/private-GGUF:Q8_0"


def test_offline_serves_the_cache_and_says_what_it_lacks(hub, tmp_path):
    pulled = client(hub, tmp_path).pull("cllm-test/tiny-GGUF:Q8_0")
    hub.log.clear()
    offline = client(hub, tmp_path, offline=True)
    assert offline.pull("cllm-test/tiny-GGUF:q8_0") == pulled.__class__(**{**pulled.__dict__, "fetched": 0})
    with pytest.raises(
        HubError,
        match=r"Q4_K_M cannot be fetched offline .*holds cllm-test/tiny-GGUF but not .*tiny-GGUF:Q4_K_M.*cllm pull",
    ):
        offline.pull("cllm-test/tiny-GGUF:Q4_K_M")
    with pytest.raises(HubError, match="has no copy of cllm-test/other-GGUF"):
        offline.pull("cllm-test/other-GGUF")
    assert hub.log == []


def test_an_unreachable_hub_falls_back_to_the_cache(hub, tmp_path):
    pulled = client(hub, tmp_path).pull("cllm-test/tiny-GGUF:Q8_0")
    gone = Hub(endpoint="http://127.0.0.1:9", cache_dir=pulled.path.split("/models--")[0], token=False, offline=False)
    assert gone.pull("cllm-test/tiny-GGUF:Q8_0").path == pulled.path
    with pytest.raises(HubError, match="cannot reach http://127.0.0.1:9 for cllm-test/tiny-GGUF.*no copy"):
        gone.pull("cllm-test/tiny-GGUF:Q4_K_M")


def test_the_store_lists_pulled_models_by_name_and_removes_one_at_a_time(hub, tmp_path):
    from cllm.hub.store import listed, remove

    h = client(hub, tmp_path)
    q4, iq2 = h.pull("cllm-test/tiny-GGUF:Q4_K_M"), h.pull("cllm-test/tiny-GGUF:IQ2_XS")
    assert {(m.name, m.path, m.size) for m in listed(h.cache_dir)} == {
        (q4.name, q4.path, len(TINY["tiny-Q4_K_M.gguf"])),
        (
            iq2.name,
            iq2.path,
            len(TINY["tiny-IQ2_XS-00001-of-00002.gguf"]) + len(TINY["tiny-IQ2_XS-00002-of-00002.gguf"]),
        ),
    }
    size = iq2.size
    assert remove(h.cache_dir, "cllm-test/tiny-GGUF:iq2_xs") == size
    assert not any(os.path.lexists(p) for p in iq2.files) and [m.name for m in listed(h.cache_dir)] == [q4.name]
    assert read(q4.path) == TINY["tiny-Q4_K_M.gguf"] and os.path.exists(q4.mmproj)
    remove(h.cache_dir, q4.name)
    assert listed(h.cache_dir) == [] and not os.path.exists(repo_folder(h.cache_dir, "cllm-test/tiny-GGUF"))


def _cli_pull(hub: FakeHub, tmp_path, name: str, stderr) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.Popen(
        [sys.executable, "-m", "cllm.cli", "pull", name], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr
    )


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log(hub, tmp_path):
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # a terminal 100 columns wide
    proc = _cli_pull(hub, tmp_path, "cllm-test/tiny-GGUF:F16", sub)
    os.close(sub)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other side closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(60) == 0
    assert re.search(rb"tiny-F16\.gguf: 100%\|\S+\| 12\.6M/12\.6M", seen), seen  # huggingface_hub's tqdm bar

    proc = _cli_pull(hub, tmp_path, "cllm-test/tiny-GGUF:Q8_0", subprocess.PIPE)
    _, log = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert b"cllm: tiny-Q8_0.gguf: 100%, 1.0 MiB of 1.0 MiB" in log and b"\r" not in log and b"|" not in log
