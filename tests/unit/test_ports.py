"""The launcher's ports stay outside the kernel's range for outgoing connections (ernie_mtl/dist/ports.py)."""
import os
import socket
import subprocess
import sys

from ernie_mtl.dist import ports
from helpers import ROOT, free_port


def test_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert ports.ephemeral_range(str(f)) == (32768, 60999)
    for bad in ("", "x y", "60999 32768", "0 100", "1 70000"):
        f.write_text(bad)
        assert ports.ephemeral_range(str(f)) is None, bad
    assert ports.ephemeral_range(str(tmp_path / "missing")) is None


def test_the_chosen_range_never_overlaps_the_ephemeral_one():
    assert ports.launcher_port_range((32768, 60999)) == (61000, 65535)  # Linux's default: above it
    assert ports.launcher_port_range((49152, 65535)) == (29151, 49151)  # IANA's (BSD, Windows): below it
    assert ports.launcher_port_range((1024, 65535)) is None  # no room anywhere: keep Paddle's default
    assert ports.launcher_port_range(None) is None
    for lo, hi in [(32768, 60999), (49152, 65535), (15000, 64600), (40000, 50000), (11000, 65000)]:
        chosen = ports.launcher_port_range((lo, hi))
        if chosen is not None:
            a, b = chosen
            assert b - a + 1 >= ports.MIN_PORTS and a >= ports.LOWEST and b <= 65535
            assert b < lo or a > hi, (lo, hi, chosen)  # disjoint


def test_shell_line_keeps_a_range_the_user_set(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768 60999")
    assert ports.shell_line({}, str(f)) == "export PORT_RANGE=61000:65535"
    assert ports.shell_line({"PORT_RANGE": "40000:41000"}, str(f)) == ""
    f.write_text("1024 65535")
    assert ports.shell_line({}, str(f)) == ""
    proc = subprocess.run([sys.executable, "-m", "ernie_mtl.dist.ports"], cwd=ROOT, capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PORT_RANGE": ""})
    assert proc.returncode == 0 and "suggested PORT_RANGE:" in proc.stdout, proc.stderr


def test_the_suite_and_its_free_ports_use_a_safe_range():
    """tests/conftest.py sets PORT_RANGE for every job the suite launches; free_port() draws from it."""
    eph = ports.ephemeral_range()
    if eph is None:
        return  # not Linux: nothing to check
    lo, hi = (int(x) for x in os.environ["PORT_RANGE"].split(":"))
    assert hi < eph[0] or lo > eph[1]
    port = free_port()
    assert lo <= port <= hi
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # and it is free


def test_each_xdist_worker_launches_within_its_own_slice_of_the_range():
    """Tests of two pytest-xdist workers launch jobs at once: disjoint port ranges, inside the suite's."""
    from helpers import worker_port_range

    assert worker_port_range("61000:65535", None, 1) == "61000:65535"
    assert worker_port_range("61000:65535", "gw0", 1) == "61000:65535"
    slices = [worker_port_range("61000:65535", f"gw{i}", 2) for i in (0, 1)]
    assert slices == ["61000:63267", "63268:65535"]
    three = [tuple(int(x) for x in worker_port_range("1000:1299", f"gw{i}", 3).split(":")) for i in range(3)]
    assert three == [(1000, 1099), (1100, 1199), (1200, 1299)]
