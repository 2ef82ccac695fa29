// The unmodified E2B SDK against a SPACE cluster: one control replica's
// E2B listener (E2B_API_URL, E2B_SANDBOX_URL) for everything; the replica
// forwards each sandbox's envd traffic to the node that runs it. Run by
// e2e/cluster_test.go; the last line printed is "ALL OK".
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const sbx = await Sandbox.create({ timeoutMs: 120_000 }) // base: seed:latest
let r = await sbx.commands.run('echo "hello from $(hostname)"; echo oops >&2')
assert.match(r.stdout, /^hello from sbx-/)
assert.equal(r.stderr, 'oops\n')
console.log('ok - commands.run through a replica')

const h = await sbx.commands.run('i=0; while [ $i -lt 5 ]; do echo tick-$i; i=$((i+1)); sleep 0.1; done', { background: true })
const done = await h.wait()
assert.equal(done.stdout.split('\n').filter(Boolean).length, 5)
console.log('ok - a background command streamed to the end')

await sbx.files.write('/tmp/cluster.txt', 'through the control plane')
assert.equal(await sbx.files.read('/tmp/cluster.txt'), 'through the control plane')
const list = await sbx.files.list('/tmp')
assert.ok(list.some((e) => e.name === 'cluster.txt'))
console.log('ok - files')

const info = await Sandbox.getInfo(sbx.sandboxId)
assert.equal(info.sandboxId, sbx.sandboxId)
await sbx.kill()
console.log('ALL OK')
