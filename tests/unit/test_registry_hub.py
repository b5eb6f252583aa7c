"""Hugging Face names in the registry (cllm/core/registry.py): ids are names, entries name repos, --pulled adds
the cache.

The hub here is a stand-in for cllm/hub/commands.HubModels (tests/unit/test_hub_pull.py and tests/test_hub_serve.py
cover the real one): it maps names to tiny GGUF-looking files.
"""

import pytest

from cllm.core.config_load import load_config
from cllm.core.registry import build_registry, is_pool
from cllm.core.settings import ConfigError


class Hub:
    def __init__(self, tmp_path, names):
        self.files = {}
        for name in names:
            path = tmp_path / (name.replace("/", "--").replace(":", "-") + ".gguf")
            path.write_bytes(b"GGUF" + bytes(60))
            self.files[name] = str(path)
        self.asked = []
        self.mmproj = {}  # name -> the projector its repo has beside it

    def resolve(self, name):
        self.asked.append(name)
        full = name if ":" in name else name + ":Q4_K_M"
        return full, self.files[full], self.mmproj.get(full)

    def listed(self):
        return [(name, path, self.mmproj.get(name)) for name, path in self.files.items()]


def config(tmp_path, yaml: str):
    path = tmp_path / "cllm.yaml"
    path.write_text(yaml)
    return load_config(str(path), {})


def test_hf_repo_serves_one_model_under_its_name(tmp_path):
    hub = Hub(tmp_path, ["org/a-GGUF:Q4_K_M"])
    (spec,) = build_registry(config(tmp_path, "hf-repo: org/a-GGUF\n"), hub)
    assert (spec.id, spec.path) == ("org/a-GGUF:Q4_K_M", hub.files["org/a-GGUF:Q4_K_M"]) and hub.asked == ["org/a-GGUF"]
    with pytest.raises(ConfigError, match="--model and --hf-repo"):
        build_registry(config(tmp_path, "hf-repo: org/a-GGUF\nmodel: x.gguf\n"), hub)


def test_a_models_entry_names_a_repo_and_takes_its_name_unless_given_an_id(tmp_path):
    hub = Hub(tmp_path, ["org/a-GGUF:Q8_0", "org/b-GGUF:Q4_K_M"])
    c = config(
        tmp_path, "models:\n  - {hf-repo: 'org/a-GGUF:Q8_0', ctx-size: 1024}\n  - {id: b, hf-repo: org/b-GGUF}\n"
    )
    specs = build_registry(c, hub)
    assert [(s.id, s.path, s.config.ctx_size) for s in specs] == [
        ("org/a-GGUF:Q8_0", hub.files["org/a-GGUF:Q8_0"], 1024),
        ("b", hub.files["org/b-GGUF:Q4_K_M"], c.ctx_size),
    ]
    for bad, why in (
        ("{id: x}", "either path or hf-repo"),
        ("{id: x, path: f.gguf, hf-repo: o/r}", "either path or hf-repo"),
        ("{path: f.gguf}", "needs an id"),
    ):
        with pytest.raises(ConfigError, match=why):
            build_registry(config(tmp_path, f"models:\n  - {bad}\n"), hub)


def test_pulled_adds_every_cached_model_once(tmp_path):
    hub = Hub(tmp_path, ["org/a-GGUF:Q8_0", "org/b-GGUF:Q4_K_M"])
    c = config(tmp_path, "pulled: true\nhf-repo: org/b-GGUF\n")
    assert is_pool(c)
    assert [s.id for s in build_registry(c, hub)] == ["org/b-GGUF:Q4_K_M", "org/a-GGUF:Q8_0"]
    with pytest.raises(ConfigError, match="Hugging Face cache holds no model.*cllm pull"):
        build_registry(config(tmp_path, "pulled: true\n"), Hub(tmp_path, []))


def test_without_a_hub_a_name_is_refused_not_fetched(tmp_path):
    with pytest.raises(ConfigError, match="--ray serves model files"):
        build_registry(config(tmp_path, "hf-repo: org/a-GGUF\n"))


def test_a_model_that_is_no_file_but_a_name_is_pulled_by_it(tmp_path, monkeypatch):
    hub = Hub(tmp_path, ["org/a-GGUF:Q4_K_M"])
    (spec,) = build_registry(config(tmp_path, "model: org/a-GGUF\n"), hub)
    assert (spec.id, spec.path) == ("org/a-GGUF:Q4_K_M", hub.files["org/a-GGUF:Q4_K_M"])
    monkeypatch.chdir(tmp_path)  # a file of that name wins: it is served, the hub is not asked
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "a-GGUF").write_bytes(b"GGUF" + bytes(60))
    (spec,) = build_registry(config(tmp_path, "model: org/a-GGUF\n"), hub)
    assert spec.path == str(tmp_path / "org" / "a-GGUF") and hub.asked == ["org/a-GGUF"]


def test_a_pulled_model_takes_the_projector_beside_it_unless_told_otherwise(tmp_path):
    hub = Hub(tmp_path, ["org/v-GGUF:Q4_K_M", "org/t-GGUF:Q8_0"])
    beside, own = tmp_path / "mmproj-v.gguf", tmp_path / "own-mmproj.gguf"
    for f in (beside, own):
        f.write_bytes(b"GGUF" + bytes(60))
    hub.mmproj["org/v-GGUF:Q4_K_M"] = str(beside)
    (spec,) = build_registry(config(tmp_path, "hf-repo: org/v-GGUF\n"), hub)
    assert spec.config.mmproj == str(beside)
    (spec,) = build_registry(config(tmp_path, "hf-repo: org/v-GGUF\nmmproj-auto: false\n"), hub)
    assert spec.config.mmproj is None
    (spec,) = build_registry(config(tmp_path, f"hf-repo: org/v-GGUF\nmmproj: {own}\n"), hub)
    assert spec.config.mmproj == str(own)
    # --mmproj is the one model's; a pool's other models take their own repo's, if any
    specs = build_registry(config(tmp_path, f"hf-repo: org/v-GGUF\nmmproj: {own}\npulled: true\n"), hub)
    assert [(s.id, s.config.mmproj) for s in specs] == [("org/v-GGUF:Q4_K_M", str(own)), ("org/t-GGUF:Q8_0", None)]
    specs = build_registry(
        config(tmp_path, "models:\n  - {hf-repo: org/v-GGUF}\n  - {hf-repo: 'org/t-GGUF:Q8_0'}\n"), hub
    )
    assert [s.config.mmproj for s in specs] == [str(beside), None]
    with pytest.raises(ConfigError, match="--mmproj .*nothing.gguf: no such file"):
        config(tmp_path, "mmproj: nothing.gguf\n")


def test_hfd_names_the_draft_model_of_the_one_model_only(tmp_path):
    """llama-server's -hfd: the draft model's file comes from the hub, for the one model; a pool's other models draft
    with none unless their entry gives one."""
    hub = Hub(tmp_path, ["org/a-GGUF:Q4_K_M", "org/draft-GGUF:Q8_0"])
    c = config(tmp_path, "hf-repo: org/a-GGUF\nhf-repo-draft: 'org/draft-GGUF:Q8_0'\nmodels-dir: " + str(tmp_path))
    specs = build_registry(c, hub)
    assert specs[0].config.model_draft == hub.files["org/draft-GGUF:Q8_0"] and "org/draft-GGUF:Q8_0" in hub.asked
    assert specs[0].config.spec_types == ("draft-simple",)  # a draft model without --spec-type, as llama-server
    assert [s.config.model_draft for s in specs[1:]] == [None] * (len(specs) - 1) and len(specs) > 1
    with pytest.raises(ConfigError, match="--model-draft and -hfd"):
        build_registry(
            config(tmp_path, f"hf-repo: org/a-GGUF\nhf-repo-draft: org/draft-GGUF\nmodel-draft: {specs[1].path}\n"), hub
        )
    with pytest.raises(ConfigError, match="spec-type draft-simple needs a draft model"):
        config(tmp_path, "spec-type: ngram,draft-simple\n")
