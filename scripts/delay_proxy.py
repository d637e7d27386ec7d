"""A TCP proxy that adds a fixed one-way delay to every byte, both ways: a LAN or WAN between an
edgespec client and its RPC worker, on one machine.

    python scripts/delay_proxy.py --listen 127.0.0.1:50060 --to 127.0.0.1:50052 --delay-ms 5

gives a 10 ms round trip: point the client at ``--rpc 127.0.0.1:50060``. Data keeps its order and
its pace (each chunk is released ``delay`` after it arrived), so bandwidth is not limited, only
latency added. Prints ``proxy: ready on HOST:PORT`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(release())
    try:
        while chunk := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay, chunk))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, b""))
    await sender


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any)")
    parser.add_argument("--to", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay added, each way")
    args = parser.parse_args()
    delay = args.delay_ms / 1000
    to_host, _, to_port = args.to.rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, int(to_port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay),
                             return_exceptions=True)

    host, _, port = args.listen.rpartition(":")
    server = await asyncio.start_server(handle, host, int(port))
    h, p = server.sockets[0].getsockname()[:2]
    print(f"proxy: ready on {h}:{p} -> {args.to}, +{args.delay_ms:g} ms each way", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
