"""The sandbox's side of an agent: started by bwrap in the agent's place, it runs the
agent and stays beside it. Not imported by Dispatch: chat.acp.process copies this file
into the sandbox and runs it with the server's interpreter (`-I -S`: no site, no user
paths), so it uses the standard library only.

    inside.py PORT SOCKET CONTROL_FD -- AGENT ARGV...

- The endpoint: the sandbox has no network but its own loopback. This listens on
  127.0.0.1:PORT there (the agent's base URL) and carries each connection to the Unix
  socket SOCKET, bound in from the host, where Dispatch's relay (chat.acp.relay)
  forwards it to the one endpoint the agent may use. PORT == 0: no endpoint.
- The agent runs in a session (and process group) of its own.
- CONTROL_FD, a socket to Dispatch, takes one word a line and answers a line:
  `others` kills every process of the sandbox outside the agent's process group and
  this one (what a cancelled prompt left running: Claude Code's Bash runs in a group
  of its own, Codex leaves a command running); `term` sends SIGTERM to the agent's
  group.
- It exits with the agent's status; bwrap's init then ends whatever is left.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

# One read of a relayed connection.
CHUNK = 64 * 1024
# Connections waiting to be accepted: an agent opens a few at once (side requests).
BACKLOG = 64


def pump(source, target):
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((target, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def relay(client, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listener, path):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=relay, args=(client, path), daemon=True).start()


def others(agent_group):
    """SIGKILL every process but PID 1 (bwrap's init), this one and the agent's group."""
    killed = 0
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in (1, me):
            continue
        try:
            if os.getpgid(pid) == agent_group:
                continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            continue
    return killed


def control(fd, agent):
    stream = socket.socket(fileno=fd)
    reader = stream.makefile("rb")
    for line in reader:
        word = line.strip()
        if word == b"others":
            answer = f"killed {others(agent.pid)}\n"
        elif word == b"term":
            with contextlib.suppress(OSError):
                os.killpg(agent.pid, signal.SIGTERM)
            answer = "ok\n"
        else:
            answer = "unknown\n"
        try:
            stream.sendall(answer.encode())
        except OSError:
            return


def main():
    port, path, control_fd = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    if sys.argv[4] != "--" or len(sys.argv) < 6:
        sys.stderr.write("usage: inside.py PORT SOCKET CONTROL_FD -- ARGV...\n")
        return 2
    if port:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(BACKLOG)
        threading.Thread(target=serve, args=(listener, path), daemon=True).start()
    try:
        agent = subprocess.Popen(sys.argv[5:], start_new_session=True)
    except OSError as exc:
        sys.stderr.write(f"cannot start {sys.argv[5]}: {exc.strerror or exc}\n")
        return 127
    threading.Thread(target=control, args=(control_fd, agent), daemon=True).start()
    status = agent.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
