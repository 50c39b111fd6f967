// Builds the two dev-stack binaries from Go modules (neither is on npm or Debian) into a cache
// directory outside the checkout, once. Builds go to a temporary name and are renamed into place,
// so an interrupted build never leaves a half-written binary behind.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';

const TEMPORAL_CLI_VERSION = 'v1.5.1';
const FERRETDB_VERSION = 'v1.24.2';
/**
 * FerretDB v1.24.2's SQLite backend looks documents up by `_id` through the SQL expression
 * `_ferretdb_sjson->'$._id'`, but builds the `_id` unique index on `_ferretdb_sjson->"_id"`. SQLite
 * uses an expression index only for the very expression it was built on, so every find, update and
 * delete by `_id` scanned the whole table (4 ms at 5,000 documents, growing with the table). The
 * build rewrites the lookup expression to the index's own; both address the same JSON value.
 */
const FERRETDB_ID_LOOKUP_PATCH = {
  file: path.join('internal', 'backends', 'sqlite', 'metadata', 'metadata.go'),
  from: `IDColumn = DefaultColumn + "->'$._id'"`,
  to: 'IDColumn = DefaultColumn + `->"_id"`',
  count: 1,
};
/**
 * It also pushes `_id` equality down to SQL only when `_id` is the filter's one key, so a
 * conditional write (`{_id, n: {$lte: …}}`, a guard against an older writer) scanned the table.
 * The build pushes `_id` equality down whatever else the filter holds: the handler applies the
 * whole filter to what SQL returns anyway, and SQL returns at most the one document of that `_id`.
 */
const FERRETDB_ID_AND_MORE_PATCH = {
  file: path.join('internal', 'backends', 'sqlite', 'collection.go'),
  from: 'if params.Filter.Len() == 1 {',
  to: 'if params.Filter.Len() > 0 {',
  count: 2, // Query and Explain
};

/**
 * And it pushes nothing else down: a range on `_id` (`{_id: {$gte: a, $lt: b}}`, how the gateway
 * reads a workspace's running totals and lists its batches newest first) or a set of `_id`s
 * (`{_id: {$in: [...]}}`, how deletions and the ledger's checks read) scanned the table. The build
 * pushes a set of strings down as SQL `IN` (exact, as equality is), and a range of plain strings
 * as a range of the index's JSON texts, returned in `_id` order, lazily, so a `limit` stops the
 * index walk. Bounds are pushed down only when made of
 * plain characters (letters, digits, `_-.:~`); the SQL range is then a superset of every plain
 * string `_id` in range (the handler applies the whole filter to what it returns). A stored `_id`
 * holding characters JSON escapes could be missed by such a range; the gateway's never do.
 */
const FERRETDB_ID_RANGE_PATCHES = [
  {
    file: path.join('internal', 'backends', 'sqlite', 'collection.go'),
    from: '\t\tswitch v.(type) {\n\t\tcase string, types.ObjectID:',
    to: '\t\tswitch v.(type) {\n\t\tcase *types.Document:\n\t\t\twhereClause, args = idRangeWhere(v.(*types.Document))\n\t\tcase string, types.ObjectID:',
    count: 2, // Query and Explain
  },
  {
    file: path.join('internal', 'backends', 'sqlite', 'collection.go'),
    from: '\torderByClause := prepareOrderByClause(params.Sort)\n',
    to: '\tfilterPushdown = whereClause != ""\n\torderByClause := prepareOrderByClause(params.Sort)\n',
    count: 1, // Explain
  },
  {
    file: path.join('internal', 'backends', 'sqlite', 'collection.go'),
    from: '// Stats implements backends.Collection interface.\n',
    to: `// idRangeWhere is the gateway build's pushdown of a plain-string _id range (see tools/binaries.ts).
func idRangeWhere(d *types.Document) (string, []any) {
\tplain := func(s string) bool {
\t\tfor i := 0; i < len(s); i++ {
\t\t\tc := s[i]
\t\t\tif !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || strings.IndexByte("_-.:~", c) >= 0) {
\t\t\t\treturn false
\t\t\t}
\t\t}
\t\treturn true
\t}
\tvar conds []string
\tvar args []any
\tfor _, k := range d.Keys() {
\t\tv, _ := d.Get(k)
\t\tif arr, isArr := v.(*types.Array); isArr && k == "$in" && arr.Len() > 0 {
\t\t\t// Equality with any of the strings: exact, as the one-value equality pushdown is.
\t\t\tmarks := make([]string, arr.Len())
\t\t\tfor i := 0; i < arr.Len(); i++ {
\t\t\t\te, _ := arr.Get(i)
\t\t\t\tif _, isStr := e.(string); !isStr {
\t\t\t\t\treturn "", nil
\t\t\t\t}
\t\t\t\tmarks[i] = "?"
\t\t\t\targs = append(args, string(must.NotFail(sjson.MarshalSingleValue(e))))
\t\t\t}
\t\t\tconds = append(conds, metadata.IDColumn+" IN ("+strings.Join(marks, ", ")+")")
\t\t\tcontinue
\t\t}
\t\ts, ok := v.(string)
\t\tif !ok || !plain(s) {
\t\t\treturn "", nil
\t\t}
\t\tswitch k {
\t\tcase "$gt", "$gte":
\t\t\tconds = append(conds, metadata.IDColumn+" >= ?")
\t\t\targs = append(args, "\\""+s)
\t\tcase "$lt", "$lte":
\t\t\tconds = append(conds, metadata.IDColumn+" <= ?")
\t\t\targs = append(args, "\\""+s+"\\"")
\t\tdefault:
\t\t\treturn "", nil
\t\t}
\t}
\tif len(conds) == 0 {
\t\treturn "", nil
\t}
\treturn " WHERE " + strings.Join(conds, " AND "), args
}

// Stats implements backends.Collection interface.
`,
    count: 1,
  },
];

/**
 * Its `update` command keeps each statement's query open until the whole command ends (a `defer`
 * inside the loop), and each open query holds one of the backend's 100 SQLite connections. A
 * command of 100 statements, or a few concurrent ones of 40, then waits forever for a connection,
 * and so does every later query of the database: FerretDB stops answering. The build closes each
 * statement's query once the statement is done.
 */
const FERRETDB_UPDATE_CLOSE_PATCHES = [
  {
    file: path.join('internal', 'handler', 'msg_update.go'),
    from: '\t\tcloser := iterator.NewMultiCloser()\n\t\tdefer closer.Close()\n',
    to: '\t\tcloser := iterator.NewMultiCloser()\n',
    count: 1,
  },
  {
    file: path.join('internal', 'handler', 'msg_update.go'),
    from: '\t\tresult, err := common.UpdateDocument(ctx, c, "update", iter, &u)\n',
    to: '\t\tresult, err := common.UpdateDocument(ctx, c, "update", iter, &u)\n\t\tcloser.Close()\n',
    count: 1,
  },
];

/**
 * Creating a collection is a `CREATE TABLE`, then its row in the metadata table, then its `_id`
 * index, each committed on its own. A FerretDB killed between the first two left a table the
 * metadata does not name: the next insert into that collection tried to create it again, and
 * failed for good ("table … already exists"). A faults test saw a batch stall that way, its
 * results' collection first written as FerretDB was killed. The build creates the table and the
 * indexes only where they are missing, so the next insert finishes what the killed one began.
 */
const FERRETDB_CREATE_AGAIN_PATCHES = [
  {
    file: path.join('internal', 'backends', 'sqlite', 'metadata', 'registry.go'),
    from: '\tq := fmt.Sprintf("CREATE TABLE %q (", tableName)\n',
    to: '\tq := fmt.Sprintf("CREATE TABLE IF NOT EXISTS %q (", tableName)\n',
    count: 1,
  },
  {
    file: path.join('internal', 'backends', 'sqlite', 'metadata', 'registry.go'),
    from: '\t\tq += "INDEX %q ON %q (%s)"\n',
    to: '\t\tq += "INDEX IF NOT EXISTS %q ON %q (%s)"\n',
    count: 1,
  },
];

/**
 * Every iterator, transaction, row set and cursor it opens is registered for leak tracking, which
 * in release builds too records the caller's stack in a pprof profile and sets a finalizer that
 * panics (stopping the server) if the object is collected unclosed. A profile of small inserts and
 * finds by `_id` put 10-12% of FerretDB's CPU in the stacks alone, and without the tracking each
 * cost 19% less. The build keeps it for debug builds only, as FerretDB already does for the stack
 * it prints.
 */
const FERRETDB_UNTRACKED_PATCH = {
  file: path.join('internal', 'util', 'resource', 'resource.go'),
  from: '\tcheckArgs(obj, token)\n',
  to: '\tcheckArgs(obj, token)\n\n\tif !debugbuild.Enabled {\n\t\treturn\n\t}\n',
  count: 2, // Track and Untrack
};

export class ToolBuildError extends Error {}

export interface ToolPaths {
  temporal: string;
  ferretdb: string;
}

type Progress = (line: string) => void;

function toolPaths(toolsDir: string): ToolPaths {
  return {
    temporal: path.join(toolsDir, `temporal-${TEMPORAL_CLI_VERSION}`),
    // The suffix names the patches, so a binary built without them is never reused.
    ferretdb: path.join(toolsDir, `ferretdb-${FERRETDB_VERSION}-id-index-4-update-close-create-untracked`),
  };
}

function isExecutable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

function requireGo(what: string, alternative: string): void {
  const probe = spawnSync('go', ['version'], { encoding: 'utf8' });
  if (probe.error || probe.status !== 0) {
    throw new ToolBuildError(
      `Cannot build ${what}: the Go toolchain ('go') is not on PATH. Install Go 1.25 or newer ` +
        `(it builds ${what} once, into the tools cache), or set ${alternative} to use a running server instead.`,
    );
  }
}

/** Runs a Go command, turning its verbose package list into periodic progress lines. */
function runGo(args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv; label: string; progress: Progress }): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn('go', args, { cwd: opts.cwd, env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const tail: string[] = [];
    let stdout = '';
    let packages = 0;
    let downloads = 0;
    const started = Date.now();
    const report = () =>
      opts.progress(
        `${opts.label}: ${downloads} modules fetched, ${packages} packages compiled (${Math.round((Date.now() - started) / 1000)}s)`,
      );
    const ticker = setInterval(report, 15_000);
    child.stdout.on('data', (b: Buffer) => {
      stdout += b.toString();
    });
    readline.createInterface({ input: child.stderr }).on('line', (line) => {
      if (line.startsWith('go: downloading')) downloads++;
      else if (/^[\w.\-/]+$/.test(line)) packages++;
      tail.push(line);
      if (tail.length > 30) tail.shift();
    });
    child.on('error', (err) => {
      clearInterval(ticker);
      reject(new ToolBuildError(`${opts.label}: could not run go: ${err.message}`));
    });
    child.on('close', (code) => {
      clearInterval(ticker);
      if (code === 0) {
        report();
        resolve(stdout);
      } else {
        reject(new ToolBuildError(`${opts.label} failed (go ${args.join(' ')}, exit ${code}):\n${tail.join('\n')}`));
      }
    });
  });
}

/** Puts a freshly built binary in place atomically: copy beside the target, then rename. */
function install(built: string, target: string): void {
  fs.mkdirSync(path.dirname(target), { recursive: true });
  fs.copyFileSync(built, `${target}.tmp`);
  fs.chmodSync(`${target}.tmp`, 0o755);
  fs.renameSync(`${target}.tmp`, target);
}

async function buildTemporal(target: string, progress: Progress): Promise<void> {
  requireGo(`the Temporal CLI ${TEMPORAL_CLI_VERSION}`, 'TEMPORAL_ADDRESS');
  const gobin = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-temporal-'));
  try {
    progress(`building the Temporal CLI ${TEMPORAL_CLI_VERSION} from Go modules (several minutes the first time)…`);
    await runGo(['install', '-v', `github.com/temporalio/cli/cmd/temporal@${TEMPORAL_CLI_VERSION}`], {
      cwd: gobin,
      env: { GOBIN: gobin },
      label: 'temporal build',
      progress,
    });
    install(path.join(gobin, 'temporal'), target);
  } finally {
    fs.rmSync(gobin, { recursive: true, force: true });
  }
}

async function buildFerretDB(target: string, progress: Progress): Promise<void> {
  requireGo(`FerretDB ${FERRETDB_VERSION}`, 'MONGODB_URI');
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-ferretdb-'));
  try {
    progress(`building FerretDB ${FERRETDB_VERSION} from Go modules (a few minutes the first time)…`);
    const info = JSON.parse(
      await runGo(['mod', 'download', '-json', `github.com/FerretDB/FerretDB@${FERRETDB_VERSION}`], {
        cwd: work,
        label: 'ferretdb download',
        progress,
      }),
    ) as { Dir?: string; Error?: string };
    if (!info.Dir) throw new ToolBuildError(`ferretdb download gave no source directory${info.Error ? `: ${info.Error}` : ''}`);
    // The module cache is read-only, and the module zip lacks build/version/version.txt, without
    // which the binary panics at start-up; so build from a writable copy with that file written.
    const src = path.join(work, 'src');
    fs.cpSync(info.Dir, src, { recursive: true });
    spawnSync('chmod', ['-R', 'u+w', src]);
    fs.writeFileSync(path.join(src, 'build', 'version', 'version.txt'), `${FERRETDB_VERSION}\n`);
    for (const patch of [
      FERRETDB_ID_LOOKUP_PATCH,
      FERRETDB_ID_AND_MORE_PATCH,
      ...FERRETDB_ID_RANGE_PATCHES,
      ...FERRETDB_UPDATE_CLOSE_PATCHES,
      ...FERRETDB_CREATE_AGAIN_PATCHES,
      FERRETDB_UNTRACKED_PATCH,
    ])
      applyPatch(src, patch);
    await runGo(['build', '-v', '-buildvcs=false', '-o', path.join(work, 'ferretdb'), './cmd/ferretdb'], {
      cwd: src,
      label: 'ferretdb build',
      progress,
    });
    install(path.join(work, 'ferretdb'), target);
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

function applyPatch(src: string, patch: { file: string; from: string; to: string; count: number }): void {
  const file = path.join(src, patch.file);
  const text = fs.readFileSync(file, 'utf8');
  if (text.split(patch.from).length - 1 !== patch.count) {
    throw new ToolBuildError(`FerretDB ${FERRETDB_VERSION}: ${patch.file} no longer holds the line the build patches (${patch.from})`);
  }
  fs.writeFileSync(file, text.split(patch.from).join(patch.to));
}

/** Returns the paths of the binaries that are needed, building any that are missing. */
export async function ensureTools(
  toolsDir: string,
  need: { temporal: boolean; ferretdb: boolean },
  progress: Progress = (l) => process.stderr.write(`${l}\n`),
): Promise<ToolPaths> {
  const paths = toolPaths(toolsDir);
  const builds: Promise<void>[] = [];
  if (need.temporal && !isExecutable(paths.temporal)) builds.push(buildTemporal(paths.temporal, progress));
  if (need.ferretdb && !isExecutable(paths.ferretdb)) builds.push(buildFerretDB(paths.ferretdb, progress));
  // Both builds at once: each is mostly waiting on downloads and single packages.
  await Promise.all(builds);
  return paths;
}
