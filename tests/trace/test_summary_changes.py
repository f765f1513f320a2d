"""The one-line summary of an upgrade (``since the baseline: …``) leads with the changed config
and inputs digests, then the versions of packages the run imported; packages it never imported
(megatron-core absent → 0.16.1 for an HF model) are left to the full message."""

from __future__ import annotations

from pytest_precalign.trace.environment import environment_diff, summary_changes


def test_digests_first_then_the_packages_the_model_imported() -> None:
    recorded = {
        "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "4.49.0"},
        "config_digest": "9ca528f65337aaaa",
        "inputs_digest": "1111",
    }
    now = {
        "versions": {
            "python": "3.11.7",
            "torch": "2.13.0",
            "transformers": "5.24.0",
            "megatron-core": "0.16.1",
            "peft": "0.21.2",
        },
        "config_digest": "c543e080e97bbbbb",
        "inputs_digest": "2222",
        "seed": 1,
    }
    changes = environment_diff(recorded, now)
    assert changes[0].startswith("transformers")  # the full list: versions first, as recorded
    summary = summary_changes(changes, {"torch", "transformers"})
    assert summary[:3] == [
        "config digest 9ca528f65337 → c543e080e97b",
        "inputs digest 1111 → 2222",
        "transformers 4.49.0 → 5.24.0",
    ]
    assert not any(c.startswith(("megatron-core", "peft")) for c in summary)
    assert "seed unset → 1" in summary  # not a package: kept
