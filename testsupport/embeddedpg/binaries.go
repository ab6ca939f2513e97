package embeddedpg

import (
	"archive/tar"
	"archive/zip"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/ulikunitz/xz"
)

// Version is the PostgreSQL version Start runs.
const Version = "17.11.0"

// mavenURL is where the zonky binaries are published.
const mavenURL = "https://repo1.maven.org/maven2/io/zonky/test/postgres"

// stallTimeout ends a download that receives nothing for this long.
const stallTimeout = 30 * time.Second

// artifact names one platform's binaries and the SHA-256 of their jar.
type artifact struct {
	platform string // zonky's name: linux-amd64, linux-arm64v8, ...
	sha256   string
	size     int64
	base     string // where it is published; "" is Maven Central (mavenURL)
}

// artifacts are the platforms with binaries, and their jars' digests as
// Maven Central served them on 2026-12-01.
var artifacts = map[string]artifact{
	"linux/amd64":        {"linux-amd64", "0dd7b72b6f335b8ecfb355fa24c5781e8a93edd09880bb77eb52ebbf29b3e96d", 14987378, ""},
	"linux/arm64":        {"linux-arm64v8", "8b042e0ea418b1927d95399207950da0734d27fe01e29503ade3bdc464ad4c2b", 14015430, ""},
	"linux/amd64/alpine": {"linux-amd64-alpine", "ace9a6f95b1c98ce84c9841267cd04ebee5d7de5dc7b8fea148ead44f145afbd", 14730308, ""},
}

// platformArtifact returns the binaries for this machine.
func platformArtifact() (artifact, error) {
	key := runtime.GOOS + "/" + runtime.GOARCH
	if _, err := os.Stat("/etc/alpine-release"); err == nil {
		key += "/alpine" // musl: the glibc builds do not run
	}
	a, ok := artifacts[key]
	if !ok {
		return artifact{}, fmt.Errorf("%w: no PostgreSQL binaries for %s", ErrUnavailable, key)
	}
	return a, nil
}

func (a artifact) url() string {
	name := "embedded-postgres-binaries-" + a.platform
	return fmt.Sprintf("%s/%s/%s/%s-%s.jar", cmp.Or(a.base, mavenURL), name, Version, name, Version)
}

// ensureBinaries returns the directory holding bin/, lib/ and share/ of
// the binaries, downloading and extracting them into cacheDir first if they
// are not there yet.
func ensureBinaries(ctx context.Context, cacheDir string, progress func(string)) (string, error) {
	a, err := platformArtifact()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, Version+"-"+a.platform)
	if _, err := os.Stat(filepath.Join(dir, "bin", "postgres")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("embeddedpg: cache directory: %w", err)
	}
	jar, err := os.CreateTemp(cacheDir, "download-*.jar")
	if err != nil {
		return "", fmt.Errorf("embeddedpg: cache directory: %w", err)
	}
	defer os.Remove(jar.Name())
	defer jar.Close()
	start := time.Now()
	progress(fmt.Sprintf("downloading PostgreSQL %s (%.0f MB, once) from %s into %s", Version, float64(a.size)/1e6, a.url(), cacheDir))
	if err := download(ctx, a, jar, progress); err != nil {
		return "", fmt.Errorf("%w: download: %w", ErrUnavailable, err)
	}
	progress(fmt.Sprintf("downloaded in %s; extracting", time.Since(start).Round(100*time.Millisecond)))
	tmp, err := os.MkdirTemp(cacheDir, "extract-*")
	if err != nil {
		return "", fmt.Errorf("embeddedpg: cache directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := extract(ctx, jar, tmp); err != nil {
		return "", fmt.Errorf("embeddedpg: extract %s: %w", a.url(), err)
	}
	if err := makeReadable(tmp); err != nil {
		return "", fmt.Errorf("embeddedpg: extract %s: %w", a.url(), err)
	}
	// The rename publishes a complete tree; a process that extracted the
	// same binaries concurrently may have won, which is as good.
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "bin", "postgres")); statErr != nil {
			return "", fmt.Errorf("embeddedpg: install binaries into %s: %w", dir, err)
		}
	}
	progress(fmt.Sprintf("PostgreSQL %s ready in %s (%s)", Version, dir, time.Since(start).Round(100*time.Millisecond)))
	return dir, nil
}

// download writes a's jar to w, checking its digest, and reports progress
// every two seconds.
func download(ctx context.Context, a artifact, w io.Writer, progress func(string)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := time.AfterFunc(stallTimeout, func() {
		cancel(fmt.Errorf("nothing received for %s", stallTimeout))
	})
	defer stalled.Stop()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url(), nil)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 15 * time.Second}).DialContext,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 20 * time.Second,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return withCause(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %s", a.url(), resp.Status)
	}
	sum := sha256.New()
	var got int64
	lastReport := time.Now()
	buf := make([]byte, 256<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			stalled.Reset(stallTimeout)
			got += int64(n)
			if got > a.size {
				return fmt.Errorf("%s: larger than the %d bytes it has", a.url(), a.size)
			}
			sum.Write(buf[:n])
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
			if time.Since(lastReport) >= 2*time.Second {
				lastReport = time.Now()
				progress(fmt.Sprintf("downloaded %.1f of %.1f MB", float64(got)/1e6, float64(a.size)/1e6))
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return withCause(ctx, err)
		}
	}
	if digest := hex.EncodeToString(sum.Sum(nil)); digest != a.sha256 {
		return fmt.Errorf("%s: SHA-256 %s, want %s", a.url(), digest, a.sha256)
	}
	return nil
}

// withCause adds why ctx ended (a stall) to err.
func withCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// extract unpacks the .txz the jar holds into dir.
func extract(ctx context.Context, jar *os.File, dir string) error {
	info, err := jar.Stat()
	if err != nil {
		return err
	}
	zr, err := zip.NewReader(jar, info.Size())
	if err != nil {
		return err
	}
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, ".txz") {
			r, err := f.Open()
			if err != nil {
				return err
			}
			defer r.Close()
			return untarXZ(ctx, r, dir)
		}
	}
	return errors.New("no .txz in the jar")
}

// untarXZ unpacks an xz-compressed tar into dir: regular files,
// directories and symbolic links, nothing outside dir (an entry's path,
// or a link's target, that leaves it is refused, and a file is never
// written through a link).
func untarXZ(ctx context.Context, r io.Reader, dir string) error {
	xr, err := xz.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(xr)
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		target := filepath.Join(dir, h.Name)
		if !inside(root, target) {
			return fmt.Errorf("entry %q leaves the directory", h.Name)
		}
		// The links already made resolve the entry's folder: it must stay
		// inside too (a link to a link may climb where neither alone did).
		if parent, err := filepath.EvalSymlinks(filepath.Dir(target)); err == nil && !inside(root, filepath.Join(parent, "x")) {
			return fmt.Errorf("entry %q leaves the directory through a link", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			err = writeFile(target, tr, h.FileInfo().Mode().Perm()|0o444)
		case tar.TypeSymlink:
			// A link must stay inside dir, or a file written through it
			// would land outside.
			from := filepath.Dir(target)
			if resolved, err := filepath.EvalSymlinks(from); err == nil {
				from = resolved
			}
			if filepath.IsAbs(h.Linkname) || !inside(root, filepath.Join(from, h.Linkname)) {
				return fmt.Errorf("entry %q links to %q, out of the directory", h.Name, h.Linkname)
			}
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				err = os.Symlink(h.Linkname, target)
			}
		}
		if err != nil {
			return err
		}
	}
}

// inside reports whether path lies under root (both cleaned, root's links
// resolved).
func inside(root, path string) bool {
	return strings.HasPrefix(filepath.Clean(path), filepath.Clean(root)+string(os.PathSeparator))
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|oNoFollow, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// makeReadable lets every user read the tree and enter its directories
// (whatever the umask), so that a server running as nobody can use
// binaries root extracted.
func makeReadable(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode().Perm() | 0o444
		if d.IsDir() || mode&0o100 != 0 {
			mode |= 0o111
		}
		return os.Chmod(path, mode)
	})
}
