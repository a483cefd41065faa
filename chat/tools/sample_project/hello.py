"""A small script for the agent to read and run: `python3 hello.py [name]`."""

import sys


def greet(name: str) -> str:
    return f"Hello, {name}! This ran in your workspace."


if __name__ == "__main__":
    print(greet(sys.argv[1] if len(sys.argv) > 1 else "world"))
