// `tandem serve` for the Node.js tests: started on a free loopback port (--port 0, the port read
// from its "listening on" line), ready once /health answers 200; stopped with SIGTERM, after
// which it must exit 0.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

export async function startServer(bin, model, args) {
  const proc = spawn(bin, ['serve', '-m', model, '--port', '0', ...args],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`tandem serve exited ${code}: ${log}`)));
  });
  for (let i = 0; i < 600; i++) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/health`)).status === 200) break;
    } catch (e) { /* not yet */ }
    await new Promise((r) => setTimeout(r, 20));
  }
  return { proc, port, url: `http://127.0.0.1:${port}` };
}

export async function stopServer(s) {
  const exited = new Promise((resolve) => s.proc.on('exit', resolve));
  s.proc.kill('SIGTERM');
  assert.equal(await exited, 0);
}
