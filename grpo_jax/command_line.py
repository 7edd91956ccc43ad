"""What the package's commands share: an argument parser whose errors are one line on stderr
with exit status 2 (absl's flags for main; argparse for export and the server's commands)."""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad or missing argument reported as `error: <message>`, exit 2
    (argparse's default prints the usage first)."""

    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
