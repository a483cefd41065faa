"""A minimal MCP server on the standard library alone, for the stdio sandbox's tests: the
sandbox shows the system's Python but not the project's packages, so its source is given
to the system's python3 with -c (tests/test_mcp_confinement.py). `broken` as its
argument: it also lists tools whose schemas no provider takes (one the SDK refuses,
one it lets through) and one fine;
`unstorable`: tools with NaN in a schema and NUL in a description; `shapes`: tools
whose schemas have what providers refuse at their top (oneOf, anyOf, allOf, not,
enum), and one past the size cap; `bulky`: ten tools past a server's total cap; `garbage`: it
writes a line that is not JSON-RPC, then nothing; `exit`: it fails at once, saying why
on stderr; `leak`: the same, quoting its token; `leak-long N`: quoting it so that its stderr's
last N characters hold only the token's end; `flood N`: N bytes on stderr, then
`bare: the end`, and it fails; `silent`: it reads and never answers
(a server hanging in its handshake). With MCP_TEST_STARTS set to a file's path, it
writes a line there each time it starts; with MCP_TEST_REQUIRE, it fails at once
unless that path exists; with MCP_TEST_LINGER set, it stays after its
stdin ends (a stuck server). Its tool `where` says what it sees (MCP_TEST_CONNECT: the
host:port addresses it tries, space-separated; MCP_TEST_LOOK: the paths it looks for,
colon-separated; MCP_TEST_WRITE: the file it writes, default written-by-mcp.txt);
`spawn` also leaves a `sleep` running in a session of its own, named
MCP_TEST_SPAWN on its command line."""

import json
import os
import socket
import subprocess
import sys
import time

if os.environ.get("MCP_TEST_STARTS"):
    # Counts its starts: a line each.
    with open(os.environ["MCP_TEST_STARTS"], "a") as starts:
        starts.write("started\n")
if os.environ.get("MCP_TEST_REQUIRE") and not os.path.exists(os.environ["MCP_TEST_REQUIRE"]):
    sys.stderr.write(f"bare: no {os.environ['MCP_TEST_REQUIRE']}\n")
    sys.exit(2)
if sys.argv[1:] == ["exit"]:
    sys.stderr.write("bare: cannot start, no configuration\n")
    sys.exit(2)
if sys.argv[1:] == ["leak"]:
    sys.stderr.write(f"bare: token {os.environ.get('MCP_TEST_TOKEN')} refused\n")
    sys.exit(2)
if sys.argv[1:2] == ["leak-long"]:
    # The token, then enough that only its end is in the last DETAIL_CHARS (argv[2]).
    token = os.environ.get("MCP_TEST_TOKEN", "")
    sys.stderr.write(f"bare: token {token}{'.' * (int(sys.argv[2]) - 5)}\n")
    sys.exit(2)
if sys.argv[1:2] == ["flood"]:
    for _ in range(int(sys.argv[2]) // 65536):
        sys.stderr.write("x" * 65535 + "\n")
    sys.stderr.write("bare: the end\n")
    sys.exit(2)
if sys.argv[1:] == ["silent"]:
    sys.stdin.read()
    sys.exit(0)
if sys.argv[1:] == ["garbage"]:
    print("hello, this is not MCP", flush=True)
    sys.stdin.read()
    sys.exit(0)

TOOLS = [
    {"name": "where", "description": "What the server sees.", "inputSchema": {"type": "object"}}
]
if os.environ.get("MCP_TEST_SPAWN"):
    TOOLS.append(
        {"name": "spawn", "description": "Leaves a process.", "inputSchema": {"type": "object"}}
    )
if sys.argv[1:] == ["broken"]:
    # A property that is no schema: the SDK lets it through, no provider takes it.
    TOOLS.append({"name": "broken", "inputSchema": {"type": "object", "properties": {"x": 5}}})
    # Valid MCP, but no JSON Schema: a provider refuses every request offering it.
    typo = {"type": "object", "properties": {"x": {"type": "strng"}}}
    TOOLS.append({"name": "typo", "inputSchema": typo})
    TOOLS.append({"name": "fine", "description": "Kept.", "inputSchema": {"type": "object"}})
if sys.argv[1:] == ["shapes"]:
    # Valid JSON Schema that providers refuse at the top, and one too big to send.
    for key, value in [
        ("oneOf", [{"required": ["a"]}, {"required": ["b"]}]),
        ("anyOf", [{"required": ["a"]}]),
        ("allOf", [{"required": ["a"]}]),
        ("not", {"required": ["a"]}),
        ("enum", [{}]),
    ]:
        schema = {"type": "object", key: value}
        TOOLS.append({"name": key.lower(), "inputSchema": schema})
    huge = {"type": "object", "properties": {"x": {"type": "string", "description": "x" * 20000}}}
    TOOLS.append({"name": "huge", "inputSchema": huge})
if sys.argv[1:] == ["bulky"]:
    # Ten tools of 10 KB each: fine one by one, too much together.
    for n in range(10):
        text = {"type": "string", "description": str(n) * 10000}
        schema = {"type": "object", "properties": {"x": text}}
        TOOLS.append({"name": f"bulky{n}", "inputSchema": schema})
if sys.argv[1:] == ["unstorable"]:
    # Valid MCP, but not JSON a database column (or a provider) takes: NaN, and a NUL.
    number = {"type": "number", "maximum": float("nan")}
    TOOLS.append({"name": "nan", "inputSchema": {"type": "object", "properties": {"n": number}}})
    TOOLS.append({"name": "nul", "description": "a\x00b", "inputSchema": {"type": "object"}})


def answer(message_id, result):
    print(json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}), flush=True)


def reaches(address):
    """Whether a TCP connection to `host:port` opens."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        return "no"
    return "yes"


def seen():
    data = os.environ.get("DISPATCH_TEST_DATA_DIR", "")
    try:
        with open(os.environ.get("MCP_TEST_WRITE", "written-by-mcp.txt"), "w") as file:
            file.write("ok")
        writable = "yes"
    except OSError:
        writable = "no"
    return {
        "reaches": {a: reaches(a) for a in os.environ.get("MCP_TEST_CONNECT", "").split()},
        "looks": {
            p: os.path.exists(p) for p in os.environ.get("MCP_TEST_LOOK", "").split(":") if p
        },
        "environ": sorted(os.environ),
        "home": os.environ.get("HOME", ""),
        "cwd": os.getcwd(),
        "token": os.environ.get("MCP_TEST_TOKEN", ""),
        "secret": os.environ.get("DISPATCH_TEST_SECRET", ""),
        "data_dir_visible": bool(data) and os.path.exists(data),
        "workspace_writable": writable,
        "pid": os.getpid(),
    }


for line in sys.stdin:
    message = json.loads(line)
    method, message_id = message.get("method"), message.get("id")
    if method == "initialize":
        answer(
            message_id,
            {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bare", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(message_id, {"tools": TOOLS})
    elif method == "tools/call":
        if message["params"]["name"] == "spawn":
            argv = [os.environ["MCP_TEST_SPAWN"], "1000"]
            subprocess.Popen(argv, executable="/bin/sleep", start_new_session=True)
        text = json.dumps(seen(), sort_keys=True)
        answer(message_id, {"content": [{"type": "text", "text": text}], "isError": False})
    elif message_id is not None:
        error = {"code": -32601, "message": "no such method"}
        print(json.dumps({"jsonrpc": "2.0", "id": message_id, "error": error}), flush=True)
if os.environ.get("MCP_TEST_LINGER"):
    time.sleep(3600)
