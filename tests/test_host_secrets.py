"""The host's secrets file is the operator's: merge only given names, keep the rest, never blank a value."""

from __future__ import annotations

from pathlib import Path

from stackbuild.host.secrets import BACKUP_SCRIPT, RESTORE_SCRIPT, merge, names_in


def test_nothing_given_changes_nothing() -> None:
    assert merge("HF_TOKEN=op\n", {}) is None
    assert merge("HF_TOKEN=op\n", {"HF_TOKEN": ""}) is None  # a shell without the variable
    assert merge(None, {}) is None


def test_given_names_update_in_place_others_kept() -> None:
    existing = "# operator's notes\nOTHER=keep me\nHF_TOKEN=old\nHF_TOKEN=dup\nexport_like=1\n"
    assert merge(existing, {"HF_TOKEN": "n$w", "NEW": "x"}) == (
        '# operator\'s notes\nOTHER=keep me\nHF_TOKEN="n\\$w"\nexport_like=1\nNEW="x"\n'
    )


def test_same_value_is_no_change() -> None:
    text = merge(None, {"A": "1"})
    assert text == '# written by stackbuild; mode 0600; secrets by name\nA="1"\n'
    assert merge(text, {"A": "1"}) is None
    assert names_in(text) == {"A"}


def test_scripts_keep_the_first_backup_and_restore_absence() -> None:
    # exact text: the host runs these; a second backup must not overwrite the incumbent's copy
    assert BACKUP_SCRIPT.startswith('{ [ -e "$2" ] || [ -e "$2.absent" ]; } && exit 0;')
    assert 'elif [ -e "$2.absent" ]; then rm -f "$1" "$2.absent"' in RESTORE_SCRIPT


def _sh(script: str, *args: str) -> None:
    import subprocess

    subprocess.run(["sh", "-c", script, "sh", *args], check=True)


def test_backup_restore_round_trip_in_sh(tmp_path: Path) -> None:
    op, bak, cand = tmp_path / "s.env", tmp_path / "state" / "bak.env", tmp_path / "s-candidate.env"
    op.write_text("HF_TOKEN=incumbent\n")
    op.chmod(0o600)
    _sh(BACKUP_SCRIPT, str(op), str(bak))
    op.write_text("HF_TOKEN=candidate\n")
    _sh(BACKUP_SCRIPT, str(op), str(bak))  # a repeated step keeps the incumbent's copy
    cand.write_text("x")
    _sh(RESTORE_SCRIPT, str(op), str(bak), str(cand))
    assert op.read_text() == "HF_TOKEN=incumbent\n" and oct(op.stat().st_mode & 0o777) == "0o600"
    assert not bak.exists() and not cand.exists()
    # no file before the deploy: the restore removes the one the deploy created
    op.unlink()
    _sh(BACKUP_SCRIPT, str(op), str(bak))
    op.write_text("HF_TOKEN=candidate\n")
    _sh(RESTORE_SCRIPT, str(op), str(bak), str(cand))
    assert not op.exists() and not list(bak.parent.iterdir())
