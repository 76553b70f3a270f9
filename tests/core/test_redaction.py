"""Credentials never become MLflow params."""

from __future__ import annotations

from tabletune.core.redaction import is_secret_key, redact_params, redact_text


def test_secret_keys_are_dropped_but_lookalikes_kept():
    params = {
        "aws_secret_access_key": "x", "password": "x", "mlflow_tracking_token": "x",
        "AWS_ACCESS_KEY_ID": "x", "api-key": "x",
        "max_tokens": 64, "n_prompts": 160, "keyword": "ok",
    }
    assert sorted(redact_params(params)) == ["keyword", "max_tokens", "n_prompts"]
    assert not is_secret_key("max_tokens")


def test_url_userinfo_is_stripped_everywhere():
    assert redact_text("s3://AKIA:pw@host/bucket") == "s3://***@host/bucket"
    nested = redact_params({"uri": "http://u:p@127.0.0.1:5000", "conf": {"password": "p",
                                                                         "x": ["ftp://a:b@h"]}})
    assert nested == {"uri": "http://***@127.0.0.1:5000",
                      "conf": {"password": "***", "x": ["ftp://***@h"]}}


def test_secret_flags_in_argument_lists_lose_their_values():
    params = redact_params({"fingerprint.extra_args": ["--enforce-eager", "--api-key", "abc",
                                                       "--hf-token=xyz", "--max-model-len", "512"]})
    assert params["fingerprint.extra_args"] == ["--enforce-eager", "--api-key", "***",
                                                "--hf-token=***", "--max-model-len", "512"]
