package console_test

import (
	"database/sql"
	"log"
	"log/slog"
	"net/http"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
)

// A service mounts the console under a path of its own, behind its own authentication
// (here basic auth against one operator; in a service, its single sign-on), with writes
// allowed and the audit records going to the service's logger. The handler is mounted
// without http.StripPrefix: it sees the whole path and writes its links below Prefix.
func Example() {
	db, err := sql.Open("mysql", os.Getenv("ORDERS_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: "t_event_record"})
	if err != nil {
		log.Fatal(err)
	}
	ops, err := console.New(console.Config{
		Stores:      []console.Store{{Name: "orders", Store: store, Lease: 10 * time.Minute}}, // the publishers' Tuning.Lease,
		Prefix:      "/ops/outbox/",
		AllowWrites: true,
		Logger:      slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		CSRFKey:     []byte(os.Getenv("CONSOLE_CSRF_KEY")), // 32 bytes or more, the same on every instance
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", operatorsOnly(ops))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// operatorsOnly is the service's authentication: the console authenticates nobody, and
// names in its audit records the basic-auth user it is given (or Config.User's answer).
func operatorsOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, password, ok := r.BasicAuth()
		if !ok || user != "oncall" || password != os.Getenv("CONSOLE_PASSWORD") {
			w.Header().Set("WWW-Authenticate", `Basic realm="operations"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
