"""Which files a name `org/repo[:QUANT]` picks in a repo: llama-server's rules (cllm/hub/names.py)."""

import pytest

from cllm.hub.names import HubNameError, RepoFile, choose, is_hub_name, parse_name

REPO = "org/model-GGUF"


def files(*paths: str) -> list[RepoFile]:
    return [RepoFile(p) for p in paths]


def test_names_parse_as_llama_server_spells_them():
    assert parse_name("unsloth/phi-4-GGUF:q4_k_m") == ("unsloth/phi-4-GGUF", "q4_k_m")
    assert parse_name("org/repo") == ("org/repo", None)
    for bad in ("repo", "org/repo/x", "/repo", "org//repo", "org/repo:Q4 K", "org/../x", "org/repo:a:b"):
        with pytest.raises(HubNameError):
            parse_name(bad)
    assert is_hub_name("org/repo:Q8_0") and not is_hub_name("models/x.gguf") and not is_hub_name("x.gguf")


def test_a_tag_matches_case_insensitively_and_names_the_model_by_the_files_quant():
    repo = files("README.md", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "model-IQ4_XS.gguf")
    c = choose(REPO, "q8_0", repo)
    assert [f.path for f in c.files] == ["model-Q8_0.gguf"] and c.name == f"{REPO}:Q8_0"
    assert choose(REPO, "iq4_xs", repo).files[0].path == "model-IQ4_XS.gguf"


def test_without_a_tag_q4_k_m_then_q8_0_then_the_first_model():
    assert choose(REPO, None, files("m-Q2_K.gguf", "m-Q8_0.gguf", "m-Q4_K_M.gguf")).tag == "Q4_K_M"
    assert choose(REPO, None, files("m-Q2_K.gguf", "m-Q8_0.gguf")).tag == "Q8_0"
    assert choose(REPO, None, files("mmproj-m-F16.gguf", "m-F16.gguf", "m-Q2_K.gguf")).files[0].path == "m-F16.gguf"


def test_a_missing_quant_lists_what_the_repo_has():
    with pytest.raises(HubNameError) as e:
        choose(REPO, "Q5_K_M", files("m-Q4_K_M.gguf", "m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"))
    assert (
        "Q5_K_M" in str(e.value)
        and "Q4_K_M: m-Q4_K_M.gguf" in str(e.value)
        and "Q8_0: m-Q8_0-00001-of-00002.gguf (2 parts)" in str(e.value)
    )
    with pytest.raises(HubNameError, match="no GGUF model file"):
        choose(REPO, None, files("README.md", "mmproj-F16.gguf"))


def test_a_quant_two_models_share_is_ambiguous():
    with pytest.raises(HubNameError, match="ambiguous.*base-Q4_0.gguf, instruct-Q4_0.gguf"):
        choose(REPO, "Q4_0", files("base-Q4_0.gguf", "instruct-Q4_0.gguf"))


def test_a_split_model_comes_whole_first_part_first():
    repo = files(
        "m-Q8_0-00003-of-00003.gguf", "m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00002-of-00003.gguf", "m-Q4_0.gguf"
    )
    c = choose(REPO, "Q8_0", repo)
    assert [f.path for f in c.files] == [f"m-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)] and c.tag == "Q8_0"
    with pytest.raises(HubNameError, match="lacks part"):
        choose(REPO, "Q8_0", repo[:2])


def test_mmproj_closest_in_folder_then_in_bits():
    repo = files(
        "q/m-Q4_K_M.gguf", "mmproj-F32.gguf", "q/mmproj-F16.gguf", "q/mmproj-Q8_0.gguf", "other/mmproj-Q4_0.gguf"
    )
    assert choose(REPO, "Q4_K_M", repo).mmproj.path == "q/mmproj-Q8_0.gguf"
    assert choose(REPO, None, files("m-Q4_K_M.gguf", "mmproj-F16.gguf")).mmproj.path == "mmproj-F16.gguf"
    assert choose(REPO, None, files("m-Q4_K_M.gguf")).mmproj is None
