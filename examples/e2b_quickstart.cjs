// The E2B SDK, unmodified, against SPACE. Install it (npm install e2b) and
// point it at SPACE's E2B-compatible listener:
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 \
//   E2B_API_KEY=<a SPACE API token> node examples/e2b_quickstart.cjs
const { Sandbox } = require('e2b')

async function main() {
  const sbx = await Sandbox.create() // template "base" is SPACE's seed:latest
  const r = await sbx.commands.run('echo "hello from $(whoami) in $(pwd)"')
  process.stdout.write(r.stdout)
  await sbx.files.write('notes.txt', 'kept across pause') // relative: under /home/user
  await sbx.pause() // a SPACE suspend: memory, processes and files saved to disk
  const again = await Sandbox.connect(sbx.sandboxId) // restores it
  console.log(await again.files.read('/home/user/notes.txt'))
  await again.kill()
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
