// Package embeddedpg runs a real, throw-away PostgreSQL for eoslab and for
// integration tests, on a machine that has none installed.
//
//	srv, err := embeddedpg.Start(ctx, embeddedpg.Options{Progress: func(s string) { log.Print(s) }})
//	if err != nil {
//		return err // errors.Is(err, embeddedpg.ErrUnavailable): no binaries here
//	}
//	defer srv.Stop()
//	pool, err := pgxpool.New(ctx, srv.URL())
//
// # What it runs
//
// The PostgreSQL [Version] binaries the zonky project publishes on Maven
// Central (io.zonky.test.postgres:embedded-postgres-binaries-<os>-<arch>,
// about 15 MB, with pgoutput for logical decoding), the same ones
// github.com/fergusstrange/embedded-postgres runs. They are downloaded once,
// checked against a SHA-256 pinned here, and extracted into the cache
// directory ([Options.CacheDir]); later starts reuse them. Each Start makes a
// fresh cluster (initdb) in its own temporary directory, listening on
// 127.0.0.1 only, on a free port, with a random password, and with what the
// outbox relay needs: wal_level=logical, replication slots and WAL senders.
// The bootstrap role (postgres) is a superuser with REPLICATION. fsync is off:
// the data is thrown away anyway.
//
// # Root
//
// PostgreSQL refuses to run as root. When the calling process is root (a
// container, CI), initdb and the server run as the user nobody instead (no
// user is created): the cluster's directory is given to nobody, and root's
// default cache is /var/cache/eoskit/postgres, which nobody can read (root's
// home usually cannot be entered by others).
//
// # Guarantees
//
//   - Every step has a deadline ([Options.DownloadTimeout], a download that
//     stalls for 30 s, [Options.StartTimeout]) and honours ctx: Start never
//     hangs, and an error says which step failed.
//   - Stop ends the server and deletes its directory; call it on every path,
//     Ctrl-C included (cancel ctx, let the deferred Stop run).
//   - The server is a child process that the kernel kills when the process
//     that started it dies (Linux's parent-death signal), so even a SIGKILLed
//     caller leaves no server running. Its directory is then left behind in
//     the temporary directory (eoskit-postgres-*); the next Start, by any
//     user allowed to, deletes the directories whose owner process is gone.
//
// # What breaks it
//
//   - No network to Maven Central on the first run, an operating system or
//     architecture without binaries (Linux amd64 and arm64, and Alpine amd64,
//     are supported), or binaries that cannot run here: Start returns an
//     error wrapping [ErrUnavailable], so a caller can go on without
//     PostgreSQL and say why.
//   - A cache directory the server's user cannot read (a CacheDir under
//     /root given by hand while running as root): Start says so.
package embeddedpg
