// The unmodified E2B SDK (pinned in package.json) against SPACE's
// E2B-compatible layer. Run by e2e/e2b_test.go with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY pointing at a real `space serve`.
// Every step asserts; the last line printed is "ALL OK".
import assert from 'node:assert/strict'
import { Sandbox, Secret, CommandExitError, NotFoundError, SandboxNotFoundError, InvalidArgumentError, ALL_TRAFFIC } from 'e2b'
import http from 'node:http'

const step = (name) => console.log('ok -', name)
const notFound = (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError

const sbx = await Sandbox.create({ timeoutMs: 180_000, metadata: { suite: 'e2e-sdk' }, envs: { GLOBAL: 'g' } })
assert.match(sbx.sandboxId, /^sbx_/)
step('create')

// commands.run: stdout, stderr, exit code
let r = await sbx.commands.run('echo hello; echo oops >&2')
assert.equal(r.exitCode, 0)
assert.equal(r.stdout, 'hello\n')
assert.equal(r.stderr, 'oops\n')
await assert.rejects(sbx.commands.run('echo partial; exit 3'), (e) => {
  assert.ok(e instanceof CommandExitError, `want CommandExitError, got ${e}`)
  assert.equal(e.exitCode, 3)
  assert.equal(e.stdout, 'partial\n')
  return true
})
step('commands.run and CommandExitError')

// The default template has what E2B's base template users reach for,
// sudo without a password included (under gVisor, which does not honour
// setuid, the agent serves it from the template's sudoers).
const tools = await sbx.commands.run('python -V && pip --version && python3 -m venv /tmp/venv && git --version && curl --version | head -1 && whoami')
assert.match(tools.stdout, /Python 3\./)
assert.match(tools.stdout, /^user$/m)
r = await sbx.commands.run('sudo -n true && sudo whoami && sudo -u user id -un && echo hi | sudo tee /root/by-sudo && sudo cat /root/by-sudo && sudo sh -c "exit 3"', { user: 'user' }).catch((e) => e)
assert.ok(r instanceof CommandExitError, `want the exit status of sudo's command, got ${r}`)
assert.equal(r.exitCode, 3)
assert.equal(r.stdout, 'root\nuser\nhi\nhi\n')
step('base template: sudo -n as user without a password, python, pip, venv, git, curl')

// envs, cwd, the default user and its home
r = await sbx.commands.run('echo "$FOO $GLOBAL"; pwd; whoami', { envs: { FOO: 'bar' }, cwd: '/tmp' })
assert.equal(r.stdout, 'bar g\n/tmp\nuser\n')
r = await sbx.commands.run('pwd; echo $HOME')
assert.equal(r.stdout, '/home/user\n/home/user\n')
r = await sbx.commands.run('whoami', { user: 'root' })
assert.equal(r.stdout, 'root\n')
let streamed = ''
r = await sbx.commands.run('for i in 1 2 3; do echo line-$i; sleep 0.05; done', { onStdout: (d) => { streamed += d } })
assert.equal(streamed, 'line-1\nline-2\nline-3\n')
step('envs, cwd, user, streaming callbacks')

// A background command: listed, then killed
const bg = await sbx.commands.run('sleep 120', { background: true })
assert.ok(bg.pid > 0)
let procs = await sbx.commands.list()
assert.ok(procs.some((p) => p.pid === bg.pid && p.args.includes('sleep 120')), JSON.stringify(procs))
assert.equal(await sbx.commands.kill(bg.pid), true)
await assert.rejects(bg.wait(), (e) => e instanceof CommandExitError)
procs = await sbx.commands.list()
assert.ok(!procs.some((p) => p.pid === bg.pid))
assert.equal(await sbx.commands.kill(999999), false)
step('background command listed and killed')

// stdin
const cat = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(cat.pid, 'piped\n')
await sbx.commands.closeStdin(cat.pid)
const catOut = await cat.wait()
assert.equal(catOut.stdout, 'piped\n')
step('stdin')

// files: text and binary, multipart and octet-stream, gzip, several at once
const info = await sbx.files.write('/home/user/dir/a.txt', 'text content')
assert.equal(info.path, '/home/user/dir/a.txt')
assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'text content')
const bin = new Uint8Array(300 * 1024)
for (let i = 0; i < bin.length; i++) bin[i] = (i * 7 + (i >> 9)) & 255
await sbx.files.write('/home/user/bin-multipart', bin)
assert.deepEqual(await sbx.files.read('/home/user/bin-multipart', { format: 'bytes' }), bin)
await sbx.files.write('/home/user/bin-octet', bin, { useOctetStream: true })
assert.deepEqual(await sbx.files.read('/home/user/bin-octet', { format: 'bytes' }), bin)
await sbx.files.write('/home/user/bin-gzip', bin, { gzip: true })
assert.deepEqual(await sbx.files.read('/home/user/bin-gzip', { format: 'bytes' }), bin)
const many = await sbx.files.write([
  { path: '/home/user/many/one.txt', data: 'one' },
  { path: '/home/user/many/two.txt', data: 'two' },
])
assert.deepEqual(many.map((e) => e.path).sort(), ['/home/user/many/one.txt', '/home/user/many/two.txt'])
assert.equal(await sbx.files.read('/home/user/many/two.txt'), 'two')
await sbx.files.write('relative.txt', 'rel')
assert.equal(await sbx.files.read('/home/user/relative.txt'), 'rel')
r = await sbx.commands.run('stat -c %U /home/user/dir/a.txt /home/user/dir; cat /home/user/dir/a.txt')
assert.equal(r.stdout, 'user\nuser\ntext content')
await assert.rejects(sbx.files.read('/home/user/missing.txt'), (e) => notFound(e))
step('files write/read: text, binary, multipart, octet-stream, gzip, several, relative')

// files: list, stat, mkdir, rename, remove
const listed = await sbx.files.list('/home/user/dir')
assert.deepEqual(listed.map((e) => [e.name, e.type]), [['a.txt', 'file']])
assert.equal(await sbx.files.exists('/home/user/dir/a.txt'), true)
assert.equal(await sbx.files.exists('/home/user/dir/nope'), false)
const st = await sbx.files.getInfo('/home/user/dir/a.txt')
assert.equal(st.size, 12)
assert.equal(st.owner, 'user')
assert.equal(await sbx.files.makeDir('/home/user/newdir'), true)
assert.equal(await sbx.files.makeDir('/home/user/newdir'), false)
await sbx.files.rename('/home/user/dir/a.txt', '/home/user/newdir/b.txt')
assert.equal(await sbx.files.read('/home/user/newdir/b.txt'), 'text content')
await sbx.files.remove('/home/user/newdir')
assert.equal(await sbx.files.exists('/home/user/newdir'), false)
step('files list, stat, makeDir, rename, remove')

// Entries as envd describes them: POSIX permission bits, a directory's own
// size, a symlink by what it leads to, lists sorted by name; removing a path
// that is not there is not an error.
await sbx.commands.run('mkdir -p /home/user/fi/sub && printf abc > /home/user/fi/z.txt && touch /home/user/fi/a.txt && ln -s sub /home/user/fi/link && chmod 750 /home/user/fi && chmod 600 /home/user/fi/z.txt')
let fi = await sbx.files.getInfo('/home/user/fi')
assert.equal(fi.type, 'dir')
assert.equal(fi.mode, 0o750)
assert.equal(fi.permissions, 'drwxr-x---')
assert.ok(fi.size > 0, `directory size ${fi.size}`)
fi = await sbx.files.getInfo('/home/user/fi/z.txt')
assert.equal(fi.mode, 0o600)
assert.equal(fi.size, 3)
fi = await sbx.files.getInfo('/home/user/fi/link')
assert.equal(fi.symlinkTarget, '/home/user/fi/sub')
assert.equal(fi.type, 'dir')
assert.deepEqual((await sbx.files.list('/home/user/fi')).map((e) => e.name), ['a.txt', 'link', 'sub', 'z.txt'])
await sbx.files.remove('/home/user/fi/never-there')
step('file info as envd: mode bits, directory size, symlink target, sorted list, remove of a missing path')

// File metadata (envd >= 0.6.2): set on write, returned by getInfo and list,
// replaced by the next write; keys lower-cased as envd does.
const meta = { owner: 'agent-7', purpose: 'a test: 1 2 3' }
const mw = await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { owner: 'agent-7', Purpose: 'a test: 1 2 3' } })
assert.deepEqual(mw.metadata, meta)
assert.deepEqual((await sbx.files.getInfo('/home/user/meta.txt')).metadata, meta)
assert.deepEqual((await sbx.files.list('/home/user')).find((e) => e.name === 'meta.txt').metadata, meta)
await sbx.files.write('/home/user/meta.txt', 'm2')
assert.equal((await sbx.files.getInfo('/home/user/meta.txt')).metadata, undefined)
step('file metadata: write, getInfo, list, replaced by the next write')

// watchDir, recursive: create, write, chmod, rename and remove, by inotify in
// the sandbox, with the entry when asked.
await sbx.files.makeDir('/home/user/watched/sub')
const seen = []
let withEntry = null
const watch = await sbx.files.watchDir('/home/user/watched', (e) => {
  seen.push(`${e.type} ${e.name}`)
  if (e.type === 'create' && e.name === 'sub/new/n') withEntry = e.entry
}, { recursive: true, includeEntry: true })
await sbx.commands.run('cd /home/user/watched && echo x > sub/f.txt && chmod 600 sub/f.txt && mv sub/f.txt sub/g.txt && rm sub/g.txt && mkdir sub/new && touch sub/new/n')
for (let i = 0; i < 50 && !seen.includes('create sub/new/n'); i++) await new Promise((r) => setTimeout(r, 100))
await watch.stop()
for (const want of ['create sub/f.txt', 'write sub/f.txt', 'chmod sub/f.txt', 'rename sub/f.txt', 'create sub/g.txt', 'remove sub/g.txt', 'create sub/new', 'create sub/new/n']) {
  assert.ok(seen.includes(want), `${want} not in ${seen.join(', ')}`)
}
assert.equal(withEntry?.path, '/home/user/watched/sub/new/n')
step('watchDir recursive: create, write, chmod, rename, remove, with entries')

// Signed file URLs work with no access token, on the plain E2B_SANDBOX_URL;
// a wrong or expired signature is refused.
const fetchText = async (url, init) => { const r = await fetch(url, init); return [r.status, await r.text()] }
await sbx.files.write('/home/user/dir/a.txt', 'text content')
assert.deepEqual(await fetchText(await sbx.downloadUrl('/home/user/dir/a.txt')), [200, 'text content'])
assert.deepEqual(await fetchText(await sbx.downloadUrl('/home/user/dir/a.txt', { useSignatureExpiration: 60 })), [200, 'text content'])
assert.equal((await fetchText(await sbx.downloadUrl('/home/user/dir/a.txt', { useSignatureExpiration: -10 })))[0], 401)
const wrong = new URL(await sbx.downloadUrl('/home/user/dir/a.txt'))
wrong.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
assert.equal((await fetchText(wrong))[0], 401)
const form = new FormData()
form.append('file', new Blob(['via a signed URL']), 'up.txt')
assert.equal((await fetchText(await sbx.uploadUrl('/home/user/signed-up.txt', { useSignatureExpiration: 60 }), { method: 'POST', body: form }))[0], 200)
assert.equal(await sbx.files.read('/home/user/signed-up.txt'), 'via a signed URL')
const wrongUp = new URL(await sbx.uploadUrl('/home/user/signed-up.txt'))
wrongUp.searchParams.set('path', '/home/user/elsewhere.txt')
assert.equal((await fetchText(wrongUp, { method: 'POST', body: form }))[0], 401)
step('signed download and upload URLs: valid, with expiry, expired, wrong')

// A PTY: a terminal, input, resize, kill
let term = ''
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { term += new TextDecoder().decode(d) } })
const waitFor = async (re) => {
  for (let i = 0; i < 100 && !re.test(term); i++) await new Promise((res) => setTimeout(res, 100))
  assert.match(term, re)
}
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('tty; stty size\n'))
await waitFor(/\/dev\/pts\/\d+[\s\S]*24 80/)
await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'))
await waitFor(/30 100/)
assert.equal(await sbx.pty.kill(pty.pid), true)
await assert.rejects(pty.wait(), (e) => e instanceof CommandExitError)
step('pty: tty, input, resize, kill')

// getMetrics: the sampled series (every 5 s) has CPU, memory and disk, and
// the CPU of a busy loop shows.
await sbx.commands.run(`sh -c 'end=$(($(date +%s)+7)); while [ $(date +%s) -lt $end ]; do :; done'`)
let series = []
for (let i = 0; i < 40 && series.length < 2; i++) {
  series = await sbx.getMetrics()
  if (series.length < 2) await new Promise((r) => setTimeout(r, 500))
}
assert.ok(series.length >= 2, `${series.length} samples`)
const lastSample = series.at(-1)
assert.ok(lastSample.timestamp instanceof Date && lastSample.cpuCount >= 1 && lastSample.memTotal > 0 && lastSample.memUsed > 0 && lastSample.diskTotal > 0, JSON.stringify(lastSample))
assert.ok(series.some((x) => x.cpuUsedPct > 20), JSON.stringify(series.map((x) => x.cpuUsedPct)))
step('getMetrics: CPU, memory and disk series after load')

// fork: each copy has the source's files and a process counting on from the
// fork instant; a write in one copy is seen by no other; each has its own
// hostname; the source runs on.
await sbx.files.write('/home/user/fork.txt', 'before')
const counter = await sbx.commands.run(`sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.1; done'`, { background: true })
await new Promise((r) => setTimeout(r, 500))
const count = async (s) => Number((await s.files.read('/tmp/counter')).trim())
// (E2B gives a fork 15 s unless asked for more: this one is asked for more.)
const [one] = await sbx.fork({ timeoutMs: 120_000 })
assert.ok(one instanceof Sandbox, `fork(): ${one}`)
assert.ok((await Sandbox.getInfo(one.sandboxId)).endAt.getTime() - Date.now() > 60_000, 'the fork has the timeout it asked for')
assert.equal(await one.files.read('/home/user/fork.txt'), 'before')
const c0 = await count(one)
await new Promise((r) => setTimeout(r, 500))
assert.ok(c0 > 1 && (await count(one)) > c0, 'the counting process runs on in the fork')
const pair = await sbx.fork({ count: 2, timeoutMs: 60_000 })
assert.equal(pair.length, 2)
assert.ok(pair.every((p) => p instanceof Sandbox && p.sandboxId !== sbx.sandboxId), `fork({count: 2}): ${pair}`)
await pair[0].files.write('/home/user/fork.txt', 'changed in one copy')
assert.equal(await pair[1].files.read('/home/user/fork.txt'), 'before')
assert.equal(await sbx.files.read('/home/user/fork.txt'), 'before')
const hosts = await Promise.all([sbx, one, ...pair].map(async (s) => (await s.commands.run('hostname')).stdout))
assert.equal(new Set(hosts).size, 4, `hostnames ${hosts}`)
await assert.rejects(sbx.fork({ count: 17 }), (e) => e instanceof InvalidArgumentError || /400/.test(String(e)))
await counter.kill()
for (const f of [one, ...pair]) await f.kill()
step('fork() and fork({count: 2}): files, a running process, independent copies, own hostnames')

// snapshots: save the running sandbox, start two sandboxes from it (each with
// its files and the counting process), list, delete; the source's own
// state is independent.
await sbx.files.write('/home/user/snap.txt', 'in the snapshot')
const snapCounter = await sbx.commands.run(`sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/snapcounter.new; mv /tmp/snapcounter.new /tmp/snapcounter; sleep 0.1; done'`, { background: true })
await new Promise((r) => setTimeout(r, 500))
const snapshot = await sbx.createSnapshot({ name: 'e2e-warm' })
assert.match(snapshot.snapshotId, /^snap_/)
assert.deepEqual(snapshot.names, ['e2e-warm'])
await sbx.files.write('/home/user/snap.txt', 'after the snapshot')
const fromSnap = [await Sandbox.create(snapshot.snapshotId, { timeoutMs: 60_000 }), await Sandbox.create(snapshot.snapshotId, { timeoutMs: 60_000 })]
for (const f of fromSnap) {
  assert.equal(await f.files.read('/home/user/snap.txt'), 'in the snapshot')
  const a = Number((await f.files.read('/tmp/snapcounter')).trim())
  await new Promise((r) => setTimeout(r, 400))
  assert.ok(a > 1 && Number((await f.files.read('/tmp/snapcounter')).trim()) > a, 'the process runs on in a sandbox from a snapshot')
}
const listedSnaps = []
const snapPager = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId })
while (snapPager.hasNext) listedSnaps.push(...(await snapPager.nextItems()))
assert.deepEqual(listedSnaps.map((x) => x.snapshotId), [snapshot.snapshotId])
assert.deepEqual((await sbx.listSnapshots().nextItems()).map((x) => x.snapshotId), [snapshot.snapshotId])
assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), true)
assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), false)
await assert.rejects(Sandbox.create(snapshot.snapshotId), (e) => /404|not found/i.test(String(e)))
assert.equal(await fromSnap[0].files.read('/home/user/snap.txt'), 'in the snapshot', 'a sandbox outlives its snapshot')
await snapCounter.kill()
for (const f of fromSnap) await f.kill()
step('createSnapshot, Sandbox.create(snapshotId) twice, listSnapshots, deleteSnapshot')

// pause (a SPACE suspend), state in getInfo and list filters
const keeper = await sbx.commands.run('sleep 300', { background: true })
await keeper.disconnect()
assert.equal(await sbx.pause(), true)
assert.equal(await sbx.pause(), false)
let got = await Sandbox.getInfo(sbx.sandboxId)
assert.equal(got.state, 'paused')
assert.equal(got.metadata.suite, 'e2e-sdk')
const ids = async (query) => {
  const out = []
  const pager = Sandbox.list({ query, limit: 100 })
  while (pager.hasNext) out.push(...(await pager.nextItems()).map((s) => s.sandboxId))
  return out
}
assert.ok((await ids({ state: ['paused'] })).includes(sbx.sandboxId))
assert.ok(!(await ids({ state: ['running'] })).includes(sbx.sandboxId))
assert.ok((await ids({ metadata: { suite: 'e2e-sdk' } })).includes(sbx.sandboxId))
assert.ok(!(await ids({ metadata: { suite: 'other' } })).includes(sbx.sandboxId))
step('pause, second pause false, paused in getInfo and list filters')

// Listing as E2B pages it: newest first unless order is asc, limit after the
// state filter, startedAfter, each sandbox once across pages.
const extra = [await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'e2e-list' } }),
  await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'e2e-list' } })]
const pages = async (opts) => {
  const out = []
  const pager = Sandbox.list(opts)
  while (pager.hasNext) {
    const items = await pager.nextItems()
    assert.ok(items.length > 0 || !pager.hasNext, 'an empty page while more are said to follow')
    out.push(...items)
  }
  return out
}
let listedSbx = await pages({ query: { metadata: { suite: 'e2e-list' } }, limit: 1 })
assert.deepEqual(listedSbx.map((s) => s.sandboxId), [extra[1].sandboxId, extra[0].sandboxId])
listedSbx = await pages({ query: { metadata: { suite: 'e2e-list' } }, limit: 1, order: 'asc' })
assert.deepEqual(listedSbx.map((s) => s.sandboxId), [extra[0].sandboxId, extra[1].sandboxId])
const both = await pages({ query: { state: ['running', 'paused'] }, limit: 1 })
assert.equal(new Set(both.map((s) => s.sandboxId)).size, both.length, 'a sandbox listed twice')
assert.ok(both.some((s) => s.sandboxId === sbx.sandboxId) && both.some((s) => s.sandboxId === extra[0].sandboxId))
const pausedOnly = await pages({ query: { state: ['paused'] }, limit: 1 })
assert.deepEqual(pausedOnly.map((s) => s.sandboxId), [sbx.sandboxId])
const since = (await Sandbox.getInfo(extra[1].sandboxId)).startedAt
listedSbx = await pages({ query: { startedAfter: since, metadata: { suite: 'e2e-list' } } })
assert.deepEqual(listedSbx.map((s) => s.sandboxId), [extra[1].sandboxId])
for (const e of extra) await e.kill()
step('list: newest first, order asc, limit after filters, startedAfter, each once across pages')

// An endpoint SPACE does not have (secrets, for now) is not "sandbox not found"
await assert.rejects(Secret.list().nextItems(), (e) => {
  assert.ok(!(e instanceof SandboxNotFoundError), `an unknown endpoint read as ${e}`)
  assert.match(String(e.message), /404/)
  return true
})
step('an unknown endpoint is not SandboxNotFoundError')

// connect restores it: files and processes intact
const again = await Sandbox.connect(sbx.sandboxId)
got = await again.getInfo()
assert.equal(got.state, 'running')
assert.equal(await again.files.read('/home/user/many/one.txt'), 'one')
procs = await again.commands.list()
assert.ok(procs.some((p) => p.pid === keeper.pid), 'a process from before pause still runs')
r = await again.commands.run('echo after resume')
assert.equal(r.stdout, 'after resume\n')
step('connect: files and commands intact')

// setTimeout moves endAt
await again.setTimeout(60_000)
got = await again.getInfo()
const left = got.endAt.getTime() - Date.now()
assert.ok(left > 50_000 && left <= 61_000, `endAt in ${left} ms`)
step('setTimeout')

// kill, then NotFound
await again.kill()
await assert.rejects(Sandbox.getInfo(sbx.sandboxId), (e) => notFound(e))
assert.equal(await Sandbox.kill(sbx.sandboxId), false)
step('kill, then NotFound')

// Timeouts: kill on timeout, and pause (suspend) on timeout
const short = await Sandbox.create({ timeoutMs: 2_000 })
const shortPause = await Sandbox.create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } })
await shortPause.files.write('/home/user/kept.txt', 'kept')
await new Promise((res) => setTimeout(res, 5_000))
await assert.rejects(Sandbox.getInfo(short.sandboxId), (e) => notFound(e))
got = await Sandbox.getInfo(shortPause.sandboxId)
assert.equal(got.state, 'paused')
const woken = await Sandbox.connect(shortPause.sandboxId, { timeoutMs: 60_000 })
assert.equal(await woken.files.read('/home/user/kept.txt'), 'kept')
await woken.kill()
step('timeout kills; onTimeout pause suspends and connect restores')

// A command streaming when its sandbox is killed ends as it does on E2B: the
// connection is cut and the SDK, finding the sandbox gone, says so.
const doomed = await Sandbox.create({ timeoutMs: 120_000 })
// (the outcome is caught at once: it may come while the kill is awaited)
const longRun = doomed.commands.run('echo started; sleep 60', { onStdout: () => {} }).then(() => null, (e) => e)
await new Promise((res) => setTimeout(res, 1_500))
await Sandbox.kill(doomed.sandboxId)
const ended = await longRun
assert.ok(ended, 'the command finished although its sandbox was killed')
assert.match(String(ended.message), /killed or reached its end of life/)
step('kill during a streaming command: the SDK reports end of life')

// Networking, against the test's upstream namespace (e2e/e2b_test.go sets
// UPSTREAM_PUBLIC and UPSTREAM_PUBLIC2: TEST-NET addresses served by HTTP,
// and allowed.example.test resolving to the first).
const pub = process.env.UPSTREAM_PUBLIC, pub2 = process.env.UPSTREAM_PUBLIC2
const reach = async (s, url) => {
  const res = await s.commands.run(`curl -sS -k -m 4 ${url}`).catch((e) => e)
  const ok = res.exitCode === 0 && res.stdout.includes('hello from upstream')
  if (!ok) console.log(`  (${url} from ${s.sandboxId}: exit ${res.exitCode} ${res.stdout}${res.stderr})`)
  return ok
}
const offline = await Sandbox.create({ timeoutMs: 120_000, allowInternetAccess: false })
assert.equal(await reach(offline, `http://${pub}/`), false)
assert.equal((await offline.getInfo()).allowInternetAccess, false)
await offline.kill()
step('allowInternetAccess: false has no egress')

const online = await Sandbox.create({ timeoutMs: 120_000, allowInternetAccess: true, network: { denyOut: [`${pub2}/32`] } })
assert.equal(await reach(online, `http://${pub}/`), true)
assert.equal(await reach(online, `https://allowed.example.test/`), true)
assert.equal(await reach(online, `http://${pub2}/`), false)
step('allowInternetAccess: true and denyOut')

await online.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: ['allowed.example.test'] })
assert.equal(await reach(online, `https://allowed.example.test/`), true)
assert.equal(await reach(online, `http://${pub}/`), false)
const netInfo = await online.getInfo()
assert.deepEqual(netInfo.network?.allowOut, ['allowed.example.test'])
step('updateNetwork: allowOut wins over denyOut all traffic')

// getHost: a server in the sandbox, reached through SPACE by its host name.
const get = (host, headers = {}) => new Promise((resolve, reject) => {
  const api = new URL(process.env.E2B_SANDBOX_URL)
  const req = http.request({ host: api.hostname, port: api.port, path: '/', headers: { host, ...headers } }, (res) => {
    let body = ''
    res.on('data', (d) => { body += d })
    res.on('end', () => resolve({ status: res.statusCode, body }))
  })
  req.on('error', reject)
  req.end()
})
await online.commands.run('cd /tmp && echo from-getHost > index.html && python3 -m http.server 8000', { background: true })
const host = online.getHost(8000)
assert.match(host, new RegExp(`^8000-${online.sandboxId}\\.`))
let page
for (let i = 0; i < 50; i++) {
  page = await get(host)
  if (page.status === 200) break
  await new Promise((res) => setTimeout(res, 100))
}
assert.equal(page.status, 200)
assert.equal(page.body, "from-getHost\n")
await online.kill()
const private_ = await Sandbox.create({ timeoutMs: 120_000, network: { allowPublicTraffic: false } })
assert.ok(private_.trafficAccessToken)
await private_.commands.run('cd /tmp && python3 -m http.server 8000', { background: true })
const phost = private_.getHost(8000)
for (let i = 0; i < 50; i++) {
  page = await get(phost, { 'e2b-traffic-access-token': private_.trafficAccessToken })
  if (page.status === 200) break
  await new Promise((res) => setTimeout(res, 100))
}
assert.equal(page.status, 200)
assert.equal((await get(phost)).status, 401)
await private_.kill()
step('getHost, public and with the traffic access token')

console.log('ALL OK')
