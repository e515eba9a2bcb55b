"""tools/browser.sh finds or installs the browser the browser tests need, on a bare machine too.

Run with a PATH of stubs (no real Chromium, apt-get or network): each branch — already there,
Playwright's own build, Debian's package as root, nothing possible — is taken when it should be.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "browser.sh"


def stub(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def bare(tmp_path):
    """A machine without Chromium: stub id, timeout, apt-get (installs a fake chromium) and python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    stub(bin_dir / "id", 'echo "$STUB_UID"')
    stub(bin_dir / "timeout", 'shift; exec "$@"')
    stub(
        bin_dir / "apt-get",
        f'echo "apt-get $*" >> {log}\n'
        f'if [ "$1" = install ]; then printf "#!/bin/bash\\n" > {bin_dir}/chromium; '
        f"chmod +x {bin_dir}/chromium; fi",
    )
    python = stub(
        tmp_path / "python",
        f'echo "python $*" >> {log}\n'
        'if [ "$1" = -m ]; then exit "$STUB_PLAYWRIGHT_RC"; fi\necho "$STUB_PLAYWRIGHT_PATH"',
    )
    pw_browser = stub(tmp_path / "playwright-chromium", "")

    def run(uid: int = 0, playwright_rc: int = 1, **env) -> tuple[subprocess.CompletedProcess, str]:
        log.write_text("")
        res = subprocess.run(
            ["/bin/bash", str(SCRIPT), str(python)],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": str(bin_dir),
                "STUB_UID": str(uid),
                "STUB_PLAYWRIGHT_RC": str(playwright_rc),
                "STUB_PLAYWRIGHT_PATH": str(pw_browser),
                **env,
            },
        )
        return res, log.read_text()

    run.bin_dir, run.pw_browser = bin_dir, pw_browser
    return run


def test_a_chromium_on_the_path_is_used_as_is(bare):
    stub(bare.bin_dir / "chromium", "")
    res, calls = bare()
    assert res.returncode == 0 and res.stdout.strip() == str(bare.bin_dir / "chromium") and calls == ""


def test_kvviz_chromium_wins(bare, tmp_path):
    mine = stub(tmp_path / "my-chromium", "")
    res, calls = bare(KVVIZ_CHROMIUM=str(mine))
    assert res.stdout.strip() == str(mine) and calls == ""


def test_playwrights_own_build_where_it_installs(bare):
    res, calls = bare(playwright_rc=0)
    assert res.returncode == 0 and res.stdout.strip() == str(bare.pw_browser)
    assert "-m playwright install --with-deps chromium" in calls and "apt-get" not in calls


def test_debians_chromium_as_root_when_playwright_cannot_download(bare):
    res, calls = bare(uid=0, playwright_rc=1)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(bare.bin_dir / "chromium")
    assert "apt-get update -q" in calls and "apt-get install -y -q chromium" in calls


def test_otherwise_one_message_says_what_to_install(bare):
    res, calls = bare(uid=1000, playwright_rc=1)
    assert res.returncode == 1 and res.stdout == "" and "apt-get" not in calls
    assert "sudo apt-get install -y chromium" in res.stderr and "KVVIZ_CHROMIUM" in res.stderr
