package pebblestore

import "github.com/cockroachdb/pebble/v2"

// CorruptCheckpointForTest writes a checkpoint of a version this code
// does not know into the pebble store in dir.
func CorruptCheckpointForTest(dir string) error {
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		return err
	}
	if err := db.Set(metaCheckpoint, []byte{99, 1, 2}, pebble.Sync); err != nil {
		db.Close()
		return err
	}
	return db.Close()
}
