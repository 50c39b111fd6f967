// Runs one command and ties its life to the process that started us: when that parent goes away
// (its IPC channel closes, as it does when the parent is killed with SIGKILL), the command is
// killed too, so no FerretDB, Temporal or sandbox outlives the gateway that owns it. SIGTERM and
// SIGINT are passed on, and the command's exit (code or signal) is reported as our own.
import { spawn } from 'node:child_process';

const [command, ...args] = process.argv.slice(2);
const child = spawn(command, args, { stdio: ['ignore', 'inherit', 'inherit'] });
child.once('error', (err) => {
  process.stderr.write(`cannot run ${command}: ${err.message}\n`);
  process.exit(127);
});
// The owner may be gone already (killed while the command started): the report then fails, and
// the command goes too. Unhandled, that failure crashed this watchdog and left the command running.
child.once('spawn', () => process.send?.({ pid: child.pid }, (err: Error | null) => err && child.kill('SIGKILL')));
process.once('disconnect', () => child.kill('SIGKILL'));
const forward = (signal: NodeJS.Signals) => () => child.kill(signal);
process.on('SIGTERM', forward('SIGTERM'));
process.on('SIGINT', forward('SIGINT'));
child.once('exit', (code, signal) => {
  if (signal) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
  } else {
    process.exit(code ?? 1);
  }
});
