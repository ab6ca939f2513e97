package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
)

// databaseFlag is a command's -database-url, whose password must not be
// on the command line: other users of the machine read a process's
// arguments. The password comes from the environment instead, as the
// SASL password does.
type databaseFlag struct{ url *string }

func addDatabaseFlag(fs *flag.FlagSet, what string) databaseFlag {
	return databaseFlag{fs.String("database-url", "", what+" (default $DATABASE_URL, else libpq's PG* variables; a password goes in $PGPASSWORD or ~/.pgpass, never on the command line)")}
}

// errPasswordInFlag refuses a -database-url that carries a password.
var errPasswordInFlag = errors.New("-database-url holds a password (or a key's sslpassword), which other users of this machine can read in its process list: " +
	"put the password in $PGPASSWORD or ~/.pgpass, or the whole URL in $DATABASE_URL")

// keywordPassword finds a password in a keyword/value connection string.
var keywordPassword = regexp.MustCompile(`(^|\s)(ssl)?password\s*=`)

// resolve returns the connection string: the flag's, refused when it
// holds a password; else $DATABASE_URL; else "" (pgx reads libpq's PG*
// variables and ~/.pgpass). given is false when none of them names a
// database.
func (d databaseFlag) resolve() (conn string, given bool, err error) {
	if v := *d.url; v != "" {
		if u, perr := url.Parse(v); perr == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
			q := u.Query()
			if pw, _ := u.User.Password(); pw != "" || q.Get("password") != "" || q.Get("sslpassword") != "" {
				return "", true, errPasswordInFlag
			}
		} else if keywordPassword.MatchString(v) {
			return "", true, errPasswordInFlag
		}
		return v, true, nil
	}
	if v := os.Getenv("DATABASE_URL"); v != "" {
		return v, true, nil
	}
	for _, name := range []string{"PGHOST", "PGDATABASE", "PGSERVICE"} {
		if os.Getenv(name) != "" {
			return "", true, nil
		}
	}
	return "", false, nil
}

// connString is resolve for a command: the connection string, or the exit
// status of a usage error it wrote to stderr (missing says what to name).
func (d databaseFlag) connString(stderr io.Writer, missing string) (string, int) {
	conn, given, err := d.resolve()
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "eoskit:", err)
		return "", exitUsage
	case !given:
		fmt.Fprintln(stderr, missing)
		return "", exitUsage
	}
	return conn, exitOK
}
