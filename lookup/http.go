package lookup

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/hotcount/hotcount/store"
)

// Handler returns the lookup API:
//
//	GET /v1/topics/{topic}         the total, from the cache or the store
//	GET /v1/topics/{topic}/shards  every shard and the total, uncached
//
// Errors are JSON, {"error": "..."}: 400 for a bad topic, 404 for another
// path, 503 when the store fails.
func (s *Service) Handler(log *zap.Logger) http.Handler {
	h := &handler{svc: s, log: log.Named("lookup")}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/topics/{topic}", h.total)
	mux.HandleFunc("GET /v1/topics/{topic}/shards", h.shards)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

type handler struct {
	svc *Service
	log *zap.Logger
}

// topic reads and checks the {topic} path value; false means it answered.
func (h *handler) topic(w http.ResponseWriter, r *http.Request) (string, bool) {
	topic := r.PathValue("topic")
	if err := store.ValidateTopic(topic, h.svc.cfg.MaxTopicBytes); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	return topic, true
}

func (h *handler) total(w http.ResponseWriter, r *http.Request) {
	topic, ok := h.topic(w, r)
	if !ok {
		return
	}
	t, err := h.svc.Total(r.Context(), topic)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	if left := h.svc.cfg.CacheTTL - time.Duration(t.AgeMs)*time.Millisecond; left > 0 {
		w.Header().Set("Cache-Control", "max-age="+strconv.Itoa(int(left/time.Second)))
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	writeJSON(w, http.StatusOK, t)
}

func (h *handler) shards(w http.ResponseWriter, r *http.Request) {
	topic, ok := h.topic(w, r)
	if !ok {
		return
	}
	t, shards, err := h.svc.Shards(r.Context(), topic)
	if err != nil {
		h.storeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, struct {
		Total
		Shards []store.Shard `json:"shards"`
	}{t, shards})
}

func (h *handler) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	h.log.Warn("lookup failed", zap.String("path", r.URL.Path), zap.Error(err))
	writeError(w, http.StatusServiceUnavailable, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // nothing to do about a client that left
}

func writeError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg}) // a struct of one string always encodes
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // nothing to do about a client that left
}
