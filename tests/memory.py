"""Memory readings the tests share (Linux /proc)."""


def rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")
