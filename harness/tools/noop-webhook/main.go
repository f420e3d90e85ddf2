// noop-webhook answers every AdmissionReview with allowed: true and no patch: the floor any
// admission webhook pays (the apiserver's encoding, the TLS round trip, the decoding), for
// bench/e2e_bench.py. Standard library only.
//
//	noop-webhook -cert tls.crt -key tls.key -addr 127.0.0.1:8443
package main

import (
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
)

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request,omitempty"`
	Response *response `json:"response,omitempty"`
}

type response struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

func admit(w http.ResponseWriter, r *http.Request) {
	// The apiserver sends at most 3 MiB; read no more than that.
	body, err := io.ReadAll(io.LimitReader(r.Body, 3<<20))
	var in review
	if err != nil || json.Unmarshal(body, &in) != nil || in.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	out := review{APIVersion: in.APIVersion, Kind: in.Kind,
		Response: &response{UID: in.Request.UID, Allowed: true}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "listen address (loopback)")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its private key (PEM)")
	flag.Parse()
	http.HandleFunc("/", admit)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	log.Fatal(http.ListenAndServeTLS(*addr, *cert, *key, nil))
}
