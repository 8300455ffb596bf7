"""Measure an emulated link: one node receives, another sends N bytes over TCP, and the receiver prints Gbit/s.

The rate counts TCP payload from the first byte received to the last. It is the link's rate less each packet's
headers, about 4 % at an MTU of 1500.

    python -m ddp_core.launch.link_probe receive ADDRESS          # prints the payload rate it received
    python -m ddp_core.launch.link_probe send ADDRESS BYTES
"""

import socket
import sys
import time

PORT = 5201
CHUNK = 1 << 20


def receive(address: str) -> float:
    with socket.create_server((address, PORT)) as server:
        connection, _ = server.accept()
        with connection:
            received, first = 0, None
            while chunk := connection.recv(CHUNK):
                first = first or time.perf_counter()
                received += len(chunk)
    return received * 8 / (time.perf_counter() - first) / 1e9


def send(address: str, size: int) -> None:
    for _ in range(100):  # the receiver may not listen yet
        try:
            connection = socket.create_connection((address, PORT))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    else:
        raise SystemExit(f"link_probe: nobody listens at {address}:{PORT}")
    with connection:
        block = b"\0" * CHUNK
        for start in range(0, size, CHUNK):
            connection.sendall(block[: min(CHUNK, size - start)])


if __name__ == "__main__":
    if sys.argv[1] == "receive":
        print(f"{receive(sys.argv[2]):.6f}")
    else:
        send(sys.argv[2], int(sys.argv[3]))
