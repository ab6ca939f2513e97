package embeddedpg

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrUnavailable is wrapped by Start's error when PostgreSQL cannot be had
// on this machine: no binaries for its platform, the download failed, or
// the binaries do not run here. A caller can go on without PostgreSQL.
var ErrUnavailable = errors.New("embedded PostgreSQL unavailable")

// Options configure Start. The zero value is ready to use.
type Options struct {
	// CacheDir holds the downloaded binaries, shared by every Start.
	// Default: eoskit/postgres in the user's cache directory
	// (os.UserCacheDir: $XDG_CACHE_HOME, else ~/.cache), except for root
	// without XDG_CACHE_HOME: /var/cache/eoskit/postgres, since the
	// server's user (nobody) must be able to read it and usually cannot
	// enter /root.
	CacheDir string
	// Progress receives one line per step (downloading, with progress
	// every two seconds; extracting; started). Default: silent.
	Progress func(step string)
	// DownloadTimeout bounds the first run's download and extraction.
	// Default 5 minutes; a download that receives nothing for 30 s ends
	// sooner.
	DownloadTimeout time.Duration
	// StartTimeout bounds creating the cluster (initdb) and starting the
	// server until it accepts connections. Default 90 s (initdb takes a
	// few seconds, longer on a loaded machine).
	StartTimeout time.Duration
}

// Server is a running PostgreSQL. Stop it.
type Server struct {
	url     string
	addr    string // host:port
	dir     string // the cluster's directory, deleted by Stop
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // set before exited closes

	stopOnce sync.Once
	stopErr  error
}

// URL is the connection URL of the bootstrap superuser (postgres, with
// REPLICATION) on database postgres.
func (s *Server) URL() string { return s.url }

// dirPrefix names the clusters' directories in the temporary directory.
const dirPrefix = "eoskit-postgres-"

// Start downloads the binaries if the cache lacks them, creates a fresh
// cluster and starts it. Cancelling ctx abandons the start (and cleans up);
// once Start has returned, ctx no longer matters: call Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if !supported {
		return nil, fmt.Errorf("%w: it runs on Linux only, not %s", ErrUnavailable, runtime.GOOS)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	acct, err := serverAccount()
	if err != nil {
		return nil, err
	}
	removeStale(os.TempDir())

	dctx, cancel := context.WithTimeout(ctx, opts.DownloadTimeout)
	bin, err := ensureBinaries(dctx, opts.CacheDir, opts.Progress)
	cancel()
	if err != nil {
		return nil, err
	}

	sctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	dir, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("embeddedpg: %w", err)
	}
	s := &Server{dir: dir}
	if err := s.start(sctx, bin, acct, opts.Progress); err != nil {
		if stopErr := s.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if ctxErr := sctx.Err(); ctxErr != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (StartTimeout %s)", err, opts.StartTimeout)
		}
		return nil, err
	}
	return s, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.CacheDir == "" {
		if os.Geteuid() == 0 && os.Getenv("XDG_CACHE_HOME") == "" {
			o.CacheDir = "/var/cache/eoskit/postgres"
		} else {
			base, err := os.UserCacheDir()
			if err != nil {
				return o, fmt.Errorf("embeddedpg: no cache directory (set Options.CacheDir): %w", err)
			}
			o.CacheDir = filepath.Join(base, "eoskit", "postgres")
		}
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if o.DownloadTimeout == 0 {
		o.DownloadTimeout = 5 * time.Minute
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
	return o, nil
}

// start creates the cluster in s.dir and starts its server.
func (s *Server) start(ctx context.Context, bin string, acct account, progress func(string)) error {
	begin := time.Now()
	if err := os.WriteFile(filepath.Join(s.dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("embeddedpg: %w", err)
	}
	// The cluster's directory stays the caller's (root's, where the
	// server runs as nobody): nobody owns only data/, so that it cannot
	// plant a link where the caller writes (pwfile, server.log) and have
	// root write, or hand over, a file of its choosing.
	data := filepath.Join(s.dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return fmt.Errorf("embeddedpg: %w", err)
	}
	if err := acct.own(data); err != nil {
		return fmt.Errorf("embeddedpg: give %s to %s: %w", data, acct.name, err)
	}
	if err := os.Chmod(s.dir, 0o755); err != nil { // the server's user enters it, and writes nothing there
		return fmt.Errorf("embeddedpg: %w", err)
	}
	// The binaries must run, as the server's user, on this machine.
	if out, err := s.command(ctx, acct, bin, "postgres", "--version").CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s cannot run %s/bin/postgres: %w: %s", ErrUnavailable, acct.name, bin, err, bytes.TrimSpace(out))
	}

	password := make([]byte, 16)
	_, _ = rand.Read(password)
	pwfile := filepath.Join(s.dir, "pwfile")
	if err := writeOwned(pwfile, []byte(hex.EncodeToString(password)), acct); err != nil {
		return fmt.Errorf("embeddedpg: %w", err)
	}
	progress("creating a cluster in " + data + " (initdb, as " + acct.name + ")")
	initdb := s.command(ctx, acct, bin, "initdb", "-D", data, "-U", "postgres", "-A", "scram-sha-256",
		"--pwfile="+pwfile, "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("embeddedpg: initdb: %w: %s", stepErr(ctx, err), lastLines(out, 5))
	}
	_ = os.Remove(pwfile)

	// A free port can be taken between choosing and binding it: try again.
	var err error
	for range 3 {
		var port int
		if port, err = freePort(); err != nil {
			return fmt.Errorf("embeddedpg: %w", err)
		}
		if err = s.serve(ctx, acct, bin, data, port); err == nil {
			s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			s.url = fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=disable", hex.EncodeToString(password), s.addr)
			break
		}
		if !errors.Is(err, errPortTaken) {
			return err
		}
	}
	if err != nil {
		return err
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	progress(fmt.Sprintf("PostgreSQL %s accepts connections on %s (started in %s, as %s)",
		Version, s.addr, time.Since(begin).Round(100*time.Millisecond), acct.name))
	return nil
}

// command runs one of the binaries as acct, in the cluster's directory
// (which acct may enter, unlike perhaps the caller's working directory).
func (s *Server) command(ctx context.Context, acct account, bin, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "bin", name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"LC_ALL=C", "TZ=UTC", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = acct.attr()
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

var errPortTaken = errors.New("port taken")

// serve starts the server on port and returns once it runs, or
// errPortTaken if it could not bind.
func (s *Server) serve(ctx context.Context, acct account, bin, data string, port int) error {
	logPath := filepath.Join(s.dir, "server.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|oNoFollow, 0o644)
	if err != nil {
		return fmt.Errorf("embeddedpg: %w", err)
	}
	defer log.Close() // the child has its own descriptor
	// Not CommandContext: the server outlives Start's ctx; Stop ends it.
	cmd := s.command(context.Background(), acct, bin, "postgres", "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "wal_level=logical",
		"-c", "max_wal_senders=20",
		"-c", "max_replication_slots=20",
		"-c", "max_connections=200",
		"-c", "fsync=off",
		"-c", "full_page_writes=off")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("embeddedpg: start postgres: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	// A server that cannot bind exits at once.
	select {
	case <-s.exited:
	case <-time.After(300 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return fmt.Errorf("embeddedpg: start postgres: %w", ctx.Err())
	}
	out, _ := os.ReadFile(logPath)
	s.cmd = nil
	if bytes.Contains(out, []byte("could not bind")) || bytes.Contains(out, []byte("already in use")) {
		return errPortTaken
	}
	return fmt.Errorf("embeddedpg: postgres exited (%v): %s", s.waitErr, lastLines(out, 5))
}

// ready waits until the server accepts a connection.
func (s *Server) ready(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.url)
		if err == nil {
			err = conn.Ping(cctx)
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return fmt.Errorf("embeddedpg: postgres exited (%v): %s", s.waitErr, lastLines(out, 5))
		case <-ctx.Done():
			return fmt.Errorf("embeddedpg: postgres did not accept connections: %w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Stop ends the server (immediate shutdown: the data is not kept) and
// deletes its directory. It returns once both are done, within about 15 s;
// later calls return the first call's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-s.exited:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				select {
				case <-s.exited:
				case <-time.After(5 * time.Second):
					s.stopErr = fmt.Errorf("embeddedpg: postgres (pid %d) did not exit after SIGKILL", s.cmd.Process.Pid)
				}
			}
		}
		if err := os.RemoveAll(s.dir); err != nil {
			s.stopErr = errors.Join(s.stopErr, fmt.Errorf("embeddedpg: %w", err))
		}
	})
	return s.stopErr
}

// removeStale deletes the clusters' directories in tmp whose owner process
// is gone (it was SIGKILLed, or its machine lost power), with any server
// still running in them. A directory this user may not delete is left.
func removeStale(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			// Being created right now, or very old: only the latter.
			if info, err := os.Stat(dir); err != nil || time.Since(info.ModTime()) < time.Hour {
				continue
			}
		} else if pid, err := strconv.Atoi(string(b)); err != nil || alive(pid) {
			continue
		}
		killLeftover(dir)
		_ = os.RemoveAll(dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stepErr names the deadline when ctx ended a step.
func stepErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", err, ctx.Err())
	}
	return err
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// writeOwned creates path (which must not exist, nor be a link) with
// content, readable by acct alone: given to acct through the open file,
// never by its name.
func writeOwned(path string, content []byte, acct account) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|oNoFollow, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	if err == nil {
		err = acct.ownFile(f)
	}
	return errors.Join(err, f.Close())
}

// namesCluster reports whether a process's command line (its arguments,
// each ended by a NUL, as /proc gives it) names the cluster in dir: an
// argument that is dir or lies under it, whole path components compared,
// so that a cluster whose directory name begins with dir's is not taken
// for it.
func namesCluster(cmdline []byte, dir string) bool {
	dir = filepath.Clean(dir)
	names := func(path string) bool { return path == dir || strings.HasPrefix(path, dir+string(filepath.Separator)) }
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		_, after, hasEq := strings.Cut(arg, "=")
		if names(arg) || hasEq && names(after) || strings.HasPrefix(arg, "-D") && names(arg[2:]) {
			return true
		}
	}
	return false
}
