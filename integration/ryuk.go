package integration

import (
	"context"
	"os"
	"path/filepath"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/log"
)

// ryukDisabledEnv is testcontainers' switch for its reaper, Ryuk.
const ryukDisabledEnv = "TESTCONTAINERS_RYUK_DISABLED"

// reaperOrNot turns testcontainers' reaper off (TESTCONTAINERS_RYUK_DISABLED
// =true in this process's environment) when its image is missing from the
// engine and a pull of it fails within 30 s: the reaper only removes what
// a crashed test binary left, every container of this package is
// terminated by its test, and without its image testcontainers fails every
// container. It looks only in the plain case: the variable empty, no
// ~/.testcontainers.properties, no TESTCONTAINERS_PROVIDER or image-name
// prefix (testcontainers may then use another engine or another name),
// and an engine that answers at DOCKER_HOST or the default socket. It
// logs what it did to c's logger. It must run before testcontainers reads
// its configuration (once per process): it says so when that happened
// already and the switch came too late.
func reaperOrNot(ctx context.Context, c common) {
	if os.Getenv(ryukDisabledEnv) != "" || os.Getenv("TESTCONTAINERS_PROVIDER") != "" ||
		os.Getenv("TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX") != "" {
		return
	}
	if home, err := os.UserHomeDir(); err != nil {
		return
	} else if _, err := os.Stat(filepath.Join(home, ".testcontainers.properties")); err == nil {
		return
	}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return // testcontainers will say what is wrong with the engine
	}
	defer cli.Close()
	image := testcontainers.ReaperDefaultImage
	if _, err := cli.ImageInspect(ctx, image); !cerrdefs.IsNotFound(err) {
		return // there, or no answer: testcontainers decides
	}
	pullCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pull, err := cli.ImagePull(pullCtx, image, client.ImagePullOptions{})
	if err == nil {
		err = pull.Wait(pullCtx)
	}
	if err == nil || ctx.Err() != nil || client.IsErrConnectionFailed(err) {
		return
	}
	logger := c.logger
	if logger == nil {
		logger = log.Default()
	}
	os.Setenv(ryukDisabledEnv, "true")
	if !testcontainers.ReadConfig().RyukDisabled {
		logger.Printf("integration: testcontainers' reaper image %s can not be had (%v), and testcontainers read its configuration before this package could turn the reaper off: set %s=true", image, err, ryukDisabledEnv)
		return
	}
	logger.Printf("integration: testcontainers' reaper image %s can not be had (%v): reaper off (%s=true); this package terminates its containers itself", image, err, ryukDisabledEnv)
}
