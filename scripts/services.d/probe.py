#!/usr/bin/env python3
"""Readiness probes for scripts/services, speaking each service's own wire protocol.

kafka HOST PORT      sends a Kafka Metadata request (v4) and succeeds when the broker answers
                     with at least one broker and an elected controller.
cassandra HOST PORT  opens a CQL native-protocol (v4) session and succeeds when
                     `SELECT release_version FROM system.local` returns a row.

Exit 0 and print the observed detail when ready, exit 1 with the reason otherwise. Plain
sockets keep the probe free of client libraries, so a fresh machine needs nothing extra.
"""
import socket
import struct
import sys

TIMEOUT_S = 3.0


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        buf += chunk
    return buf


def kafka_string(value):
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def probe_kafka(host, port):
    client_id = kafka_string("prosody-probe")
    # Metadata v4: header v1 (api key, version, correlation id, client id), then
    # topics = null (-1, all topics) and allow_auto_topic_creation = false.
    body = struct.pack(">hhi", 3, 4, 7) + client_id + struct.pack(">ib", -1, 0)
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", recv_exact(sock, 4))
        resp = recv_exact(sock, size)
    pos = 4  # correlation id
    pos += 4  # throttle_time_ms
    (brokers,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    for _ in range(brokers):
        pos += 4  # node id
        (hlen,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + hlen
        pos += 4  # port
        (rlen,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + max(rlen, 0)
    (clen,) = struct.unpack_from(">h", resp, pos)
    pos += 2 + max(clen, 0)
    (controller,) = struct.unpack_from(">i", resp, pos)
    if brokers < 1 or controller < 0:
        raise RuntimeError(f"metadata has {brokers} broker(s), controller {controller}")
    return f"{brokers} broker(s), controller {controller}"


def cql_frame(opcode, body, stream=1):
    return struct.pack(">BBhBi", 0x04, 0, stream, opcode, len(body)) + body


def cql_read(sock):
    header = recv_exact(sock, 9)
    _version, _flags, _stream, opcode, length = struct.unpack(">BBhBi", header)
    return opcode, recv_exact(sock, length)


def cql_error(body):
    code, = struct.unpack_from(">i", body, 0)
    (mlen,) = struct.unpack_from(">H", body, 4)
    return f"CQL error {code:#x}: {body[6:6 + mlen].decode(errors='replace')}"


def probe_cassandra(host, port):
    startup = struct.pack(">H", 1) + struct.pack(">H", 11) + b"CQL_VERSION" + struct.pack(">H", 5) + b"3.0.0"
    query = b"SELECT release_version FROM system.local"
    query_body = struct.pack(">i", len(query)) + query + struct.pack(">HB", 0x0001, 0)
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(cql_frame(0x01, startup))
        opcode, body = cql_read(sock)
        if opcode == 0x00:
            raise RuntimeError(cql_error(body))
        if opcode != 0x02:
            raise RuntimeError(f"expected READY, got opcode {opcode:#x}")
        sock.sendall(cql_frame(0x07, query_body, stream=2))
        opcode, body = cql_read(sock)
    if opcode == 0x00:
        raise RuntimeError(cql_error(body))
    (kind,) = struct.unpack_from(">i", body, 0)
    if opcode != 0x08 or kind != 2:
        raise RuntimeError(f"expected ROWS, got opcode {opcode:#x} kind {kind}")
    # Rows: flags, column count, [paging state], [global table spec], column specs, row count.
    flags, columns = struct.unpack_from(">ii", body, 4)
    pos = 12
    if flags & 0x0002:  # has_more_pages
        (plen,) = struct.unpack_from(">i", body, pos)
        pos += 4 + max(plen, 0)
    if flags & 0x0001:  # global_tables_spec
        for _ in range(2):
            (slen,) = struct.unpack_from(">H", body, pos)
            pos += 2 + slen
    for _ in range(columns):
        if not flags & 0x0001:
            for _ in range(2):
                (slen,) = struct.unpack_from(">H", body, pos)
                pos += 2 + slen
        (nlen,) = struct.unpack_from(">H", body, pos)
        pos += 2 + nlen
        pos += 2  # type option id (varchar)
    (rows,) = struct.unpack_from(">i", body, pos)
    pos += 4
    if rows < 1:
        raise RuntimeError("system.local returned no row")
    (vlen,) = struct.unpack_from(">i", body, pos)
    version = body[pos + 4:pos + 4 + vlen].decode()
    return f"release_version {version}"


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("kafka", "cassandra"):
        print("usage: probe.py kafka|cassandra HOST PORT", file=sys.stderr)
        return 2
    service, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        detail = probe_kafka(host, port) if service == "kafka" else probe_cassandra(host, port)
    except (OSError, RuntimeError, struct.error) as exc:
        print(f"{service} not ready: {exc}")
        return 1
    print(detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
