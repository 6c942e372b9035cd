"""BYTEPS_AUTH_KEY, pure parts: where the key comes from, the proofs, the launcher's checks."""

import pytest

from kvstore_byteps.config import Config, Env
from kvstore_byteps.errors import ConfigError
from kvstore_byteps.van import auth


KEY = b"k" * 32


def test_the_key_comes_from_the_variable_or_a_file_and_never_shows_in_repr(tmp_path):
    assert Config.from_env({}).auth_key is None and not Config.from_env({}).auth
    cfg = Config.from_env({Env.AUTH_KEY: "s3cret-s3cret-s3cret"})
    assert cfg.auth and cfg.auth_key == b"s3cret-s3cret-s3cret"
    assert "s3cret" not in repr(cfg)
    path = tmp_path / "key"
    path.write_bytes(b"0123456789abcdef0123\n")
    assert Config.from_env({Env.AUTH_KEY_FILE: str(path)}).auth_key == b"0123456789abcdef0123"


def test_bad_keys_are_refused_without_quoting_them(tmp_path):
    with pytest.raises(ConfigError, match="at least 16") as short:
        Config.from_env({Env.AUTH_KEY: "tiny-secret"})
    assert "tiny-secret" not in str(short.value)
    with pytest.raises(ConfigError, match="not both"):
        Config.from_env({Env.AUTH_KEY: "x" * 20, Env.AUTH_KEY_FILE: "/nonexistent"})
    with pytest.raises(ConfigError, match="BYTEPS_AUTH_KEY_FILE=.*cannot be read"):
        Config.from_env({Env.AUTH_KEY_FILE: str(tmp_path / "missing")})


def test_proofs_bind_the_key_both_nonces_and_the_side():
    key, other = auth.hmac_key(KEY), auth.hmac_key(b"o" * 32)
    mine, theirs = auth.new_nonce(), auth.new_nonce()
    proof = auth.tcp_proof(key, auth.CONNECTOR, mine, theirs)
    assert len(proof) == auth.PROOF_BYTES and len(mine) == auth.NONCE_BYTES
    assert auth.tcp_proof_ok(key, auth.CONNECTOR, mine, theirs, proof)
    assert not auth.tcp_proof_ok(other, auth.CONNECTOR, mine, theirs, proof)
    assert not auth.tcp_proof_ok(key, auth.ACCEPTOR, mine, theirs, proof)      # reflected
    assert not auth.tcp_proof_ok(key, auth.CONNECTOR, theirs, mine, proof)     # swapped
    assert auth.curve_secret(KEY) != auth.hmac_key(KEY) and len(auth.curve_secret(KEY)) == 32


def test_the_launcher_refuses_mxnets_scheduler_or_server_with_a_key(capsys):
    from kvstore_byteps.launcher.cli import parse_args
    environ = {"BYTEPS_AUTH_KEY": "x" * 20}
    for option in (["--server", "mxnet"], ["--scheduler", "mxnet"]):
        with pytest.raises(SystemExit):
            parse_args(["-n", "1"] + option + ["python", "t.py"], environ)
        assert "cannot authenticate" in capsys.readouterr().err
    assert parse_args(["-n", "1", "python", "t.py"], environ).server == "byteps"
    with pytest.raises(SystemExit):       # also when the key is passed with --env
        parse_args(["-n", "1", "--server", "mxnet", "--env", "BYTEPS_AUTH_KEY=" + "y" * 20,
                    "python", "t.py"], {})


def test_the_launcher_warns_that_a_key_on_the_ssh_command_line_is_visible(tmp_path, capsys):
    from kvstore_byteps.launcher.cli import parse_args
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1\n")
    parse_args(["-n", "1", "--launcher", "ssh", "-H", str(hostfile), "--env",
                "BYTEPS_AUTH_KEY=" + "y" * 20, "python", "t.py"], {})
    assert "prefer BYTEPS_AUTH_KEY_FILE" in capsys.readouterr().err
