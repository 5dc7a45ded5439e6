"""Loopback servers for the CLI's egress tests; the standard library only.

  servers.py https DIR   an HTTPS server on 127.0.0.1 with DIR/cert.pem and DIR/key.pem (the test
                         writes them); prints its port, logs each request to DIR/seen
  servers.py proxy LOG   an HTTP CONNECT proxy on 127.0.0.1 that sends every tunnel to 127.0.0.1 at
                         the requested port; prints its port, appends each CONNECT line to LOG

Each serves until killed. Nothing listens beyond 127.0.0.1."""

import http.server
import os
import socket
import ssl
import sys
import threading


def https(directory):
    seen = open(os.path.join(directory, "seen"), "a", buffering=1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            auth = self.headers.get("Authorization")
            seen.write(self.path + (" " + auth if auth else "") + "\n")
            body = b"hello over tls"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem"))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def proxy(log):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    print(listener.getsockname()[1], flush=True)
    out = open(log, "a", buffering=1)
    while True:
        client, _ = listener.accept()
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                break
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        out.write(line + "\n")
        try:
            method, target, _ = line.split(" ", 2)
            port = int(target.rsplit(":", 1)[1])
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
        except (ValueError, OSError):
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            client.close()
            continue
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    {"https": https, "proxy": proxy}[sys.argv[1]](sys.argv[2])
