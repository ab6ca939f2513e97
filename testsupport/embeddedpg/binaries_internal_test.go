package embeddedpg

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ulikunitz/xz"
)

// txz packs entries (a name ending in "@" is a link to its body) into an
// xz-compressed tar.
func txz(t *testing.T, entries ...[2]string) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Size: int64(len(e[1])), Typeflag: tar.TypeReg}
		if name, ok := strings.CutSuffix(e[0], "@"); ok {
			h = &tar.Header{Name: name, Linkname: e[1], Typeflag: tar.TypeSymlink}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte(e[1]))
		}
	}
	_ = tw.Close()
	var out bytes.Buffer
	xw, err := xz.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = xw.Write(raw.Bytes())
	_ = xw.Close()
	return out.Bytes()
}

// An archive's link that points out of the extraction directory, followed
// by a file written through it, writes nothing outside: the link is
// refused. Before, the file landed where the link pointed (issue 47 item
// 16, failing on a0c3743).
func TestExtractionStaysInItsDirectory(t *testing.T) {
	outside := t.TempDir()
	for name, link := range map[string]string{"absolute": outside, "relative": "../../" + filepath.Base(outside)} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(filepath.Dir(outside), "x", "extract-"+name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			link := link
			if name == "relative" {
				rel, _ := filepath.Rel(dir, outside)
				link = rel
			}
			err := untarXZ(context.Background(), bytes.NewReader(txz(t, [2]string{"lib@", link}, [2]string{"lib/planted", "owned"})), dir)
			if _, statErr := os.Stat(filepath.Join(outside, "planted")); statErr == nil {
				t.Fatalf("a file was written outside the directory, through a link (untar: %v)", err)
			}
			if err == nil {
				t.Fatal("an archive with a link out of the directory was extracted without error")
			}
		})
	}
	// Links that each stay inside, chained, climb out: refused too.
	chain := t.TempDir()
	err := untarXZ(context.Background(), bytes.NewReader(txz(t, [2]string{"x/y/l1@", ".."}, [2]string{"x/y/l1/l2@", "../.."}, [2]string{"x/y/l1/l2/escaped", "owned"})), chain)
	if _, statErr := os.Stat(filepath.Join(filepath.Dir(chain), "escaped")); statErr == nil || err == nil {
		t.Fatalf("a chain of links climbed out of the directory (untar: %v)", err)
	}
	// A link inside the directory is kept.
	dir := t.TempDir()
	if err := untarXZ(context.Background(), bytes.NewReader(txz(t, [2]string{"lib/real", "x"}, [2]string{"lib/alias@", "real"})), dir); err != nil {
		t.Fatalf("a link within the directory: %v", err)
	}
}

// A download larger than the artifact's size ends at once, with an error
// that says so, rather than writing whatever the server sends (issue 47
// item 16, failing on a0c3743).
func TestDownloadStopsPastTheArtifactsSize(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	a := artifact{platform: "test", sha256: "00", size: 1 << 20, base: srv.URL}
	var got countingWriter
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := download(ctx, a, &got, func(string) {})
	if err == nil || !strings.Contains(err.Error(), "larger") || got.n > a.size+(256<<10) {
		t.Fatalf("download = %v after %d bytes; want it refused soon past %d bytes", err, got.n, a.size)
	}
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// The stale-cluster cleanup takes a process for the cluster's only when
// one of its arguments is the cluster's data directory or lies under its
// directory: a directory whose name another's begins with is not it.
// Before, the command line merely had to contain the name (issue 47 item
// 16).
func TestNamesClusterMatchesWholePaths(t *testing.T) {
	args := func(a ...string) []byte { return []byte(strings.Join(a, "\x00") + "\x00") }
	for _, c := range []struct {
		cmdline []byte
		want    bool
	}{
		{args("postgres", "-D", "/tmp/pg1/data"), true},
		{args("postgres", "-D", "/tmp/pg10/data"), false},
		{args("vim", "/tmp/pg1x"), false},
		{args("postgres", "--config-file=/tmp/pg1/data/postgresql.conf"), true},
		{args("postgres", "-D/tmp/pg1/data"), true},
	} {
		if got := namesCluster(c.cmdline, "/tmp/pg1"); got != c.want {
			t.Errorf("namesCluster(%q) = %v, want %v", c.cmdline, got, c.want)
		}
	}
}
