#!/usr/bin/env node
// dynalite's command line, with one guard: dynalite rethrows the error of a
// request whose client went away before sending the whole body
// (node_modules/dynalite/index.js: req.on('error', err => { throw err })),
// and that throw ends the process. A test that SIGKILLs a sidecar, or an SDK
// client whose timeout cuts a slow call, would take the store down with it.
// The error only says that nobody is left to answer: a request whose body
// did not end was never acted on, and one whose body did is carried out as
// usual. So the guard drops it; every other error still ends the process.
process.on('uncaughtException', (err) => {
  if (err && err.code === 'ECONNRESET' && err.message === 'aborted') {
    return
  }
  console.error(err)
  process.exit(1)
})
require('dynalite/cli.js')
