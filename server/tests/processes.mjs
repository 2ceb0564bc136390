// Helpers shared by the Node test packages (sdk/node, ui) that start real `reprise` and `reprise-sim`
// processes: a free loopback port, and waiting until a URL answers. Dependency-free on purpose.
import net from "node:net";

/** A port on 127.0.0.1 that was free a moment ago. */
export function freePort() {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Polls `url` every 50 ms until it answers 2xx, at most `tries` times. */
export async function waitReady(url, tries = 600) {
  for (let i = 0; i < tries; i++) {
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${url} not ready`);
}
